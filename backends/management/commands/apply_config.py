from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from backends.config_file import ConfigError, apply, load_file


class Command(BaseCommand):
    help = (
        "Create or update servers, models, deployments and teams from a YAML or TOML file"
        " (.toml). Idempotent; a file with any error changes nothing. With --prune, also delete"
        " what the file leaves out."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Check the file and say what would change, without changing anything.",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="Also delete what the file leaves out: servers, models and teams its lists"
            " do not name, and deployments a server's list does not have. Lists the file"
            " does not have are left alone.",
        )

    def handle(self, *args, file: str, dry_run: bool, prune: bool, **options) -> None:
        try:
            with transaction.atomic():
                summary = apply(load_file(file), prune=prune)
                if dry_run:
                    transaction.set_rollback(True)
        except ConfigError as exc:
            raise CommandError(f"{file}: {exc}") from exc
        verb = "Would apply" if dry_run else "Applied"
        self.stdout.write(f"{verb} {file}: {summary}")
