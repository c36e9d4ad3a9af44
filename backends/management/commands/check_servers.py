from django.core.management.base import BaseCommand, CommandError

from backends.checkup import ERROR, check_server
from backends.management.servers import servers_named
from backends.models import Server


class Command(BaseCommand):
    help = (
        "Ask each server whether it is set up as Switchyard needs it: that it answers, as the"
        " kind configured, and lists every deployment's model. Changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("servers", nargs="*", metavar="SERVER", help="default: all")

    def handle(self, *args, servers: list[str], **options) -> None:
        failed = []
        for server in servers_named(servers, default=Server.objects.order_by("name")):
            report = check_server(server)
            self.stdout.write(str(report))
            if report.worst == ERROR:
                failed.append(server.name)
        if failed:
            raise CommandError(f"to fix on: {', '.join(failed)}")
