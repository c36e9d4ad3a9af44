from django.core.management.base import BaseCommand, CommandError

from backends.config_file import ConfigError, apply, load_file


class Command(BaseCommand):
    help = (
        "Create or update servers, models and deployments from a YAML or TOML file (.toml). "
        "Idempotent; a file with any error changes nothing."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file")

    def handle(self, *args, file: str, **options) -> None:
        try:
            summary = apply(load_file(file))
        except ConfigError as exc:
            raise CommandError(f"{file}: {exc}") from exc
        self.stdout.write(f"Applied {file}: {summary}")
