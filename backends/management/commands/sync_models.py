from django.core.management.base import BaseCommand, CommandError

from backends.discovery import sync_server
from backends.models import Server


class Command(BaseCommand):
    help = (
        "Ask servers which models they have and create the missing models and deployments. "
        "Never deletes or overwrites anything."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("servers", nargs="*", metavar="SERVER", help="default: all enabled")

    def handle(self, *args, servers: list[str], **options) -> None:
        if servers:
            found = {s.name: s for s in Server.objects.filter(name__in=servers)}
            missing = [name for name in servers if name not in found]
            if missing:
                raise CommandError(f"no such server: {', '.join(missing)}")
            targets = [found[name] for name in servers]
        else:
            targets = list(Server.objects.filter(enabled=True))
        failed = []
        for server in targets:
            report = sync_server(server)
            self.stdout.write(str(report))
            if report.error:
                failed.append(server.name)
        if failed:
            raise CommandError(f"could not list models on: {', '.join(failed)}")
