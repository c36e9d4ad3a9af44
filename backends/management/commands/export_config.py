import yaml
from django.core.management.base import BaseCommand

from backends.config_file import export


class Command(BaseCommand):
    help = (
        "Print every server, model, deployment and team as a configuration file (YAML) that"
        " apply_config takes back; servers' API keys are left out."
    )

    def handle(self, *args, **options) -> None:
        self.stdout.write(yaml.safe_dump(export(), sort_keys=False, allow_unicode=True), ending="")
