"""First run: migrate, load the demo data into an empty database, create an admin user."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from backends.models import Server


class Command(BaseCommand):
    help = "Migrate, load demo data when the database is empty, create an admin user once."

    def handle(self, *args, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        if not Server.objects.exists():
            call_command("apply_config", str(settings.BASE_DIR / "config" / "demo.yaml"))
        users = get_user_model()
        if not users.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            users.objects.create_superuser("admin", "", password)
            self.stdout.write(
                self.style.WARNING(
                    f"Created the admin user: admin / {password}  (shown once; keep it)"
                )
            )
