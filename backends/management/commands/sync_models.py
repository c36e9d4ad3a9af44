from django.core.management.base import BaseCommand, CommandError

from backends.discovery import sync_server
from backends.management.servers import servers_named
from backends.models import Server


class Command(BaseCommand):
    help = (
        "Ask servers which models they have and create the missing models and deployments. "
        "Never deletes or overwrites anything."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("servers", nargs="*", metavar="SERVER", help="default: all enabled")

    def handle(self, *args, servers: list[str], **options) -> None:
        failed = []
        for server in servers_named(servers, default=Server.objects.filter(enabled=True)):
            report = sync_server(server)
            self.stdout.write(str(report))
            if report.error:
                failed.append(server.name)
        if failed:
            raise CommandError(f"could not list models on: {', '.join(failed)}")
