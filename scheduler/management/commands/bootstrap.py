"""First run: migrate, load the demo data into an empty database, create an admin user."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from access.models import ApiKey
from backends.models import Server

DEMO_FILE = settings.BASE_DIR / "config" / "demo.yaml"


class Command(BaseCommand):
    help = (
        "Migrate, load the demo data when the database has no servers, and create an admin "
        "user with a random password and a demo API key (each printed once) when there are none."
    )

    def handle(self, *args, **options) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        if Server.objects.exists():
            self.stdout.write("Servers already configured: demo data not loaded.")
        else:
            call_command("apply_config", str(DEMO_FILE), stdout=self.stdout)
        self.create_admin()
        self.create_demo_key()

    def create_demo_key(self) -> None:
        if ApiKey.objects.exists():
            return
        api_key, secret = ApiKey.generate("demo")
        api_key.save()
        self.stdout.write(
            self.style.WARNING(
                f"Created the demo API key: {secret}  (shown only this once; send it as"
                " `Authorization: Bearer <key>`, or the OpenAI clients' api_key)"
            )
        )

    def create_admin(self) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        username = "admin"
        if users.objects.filter(username=username).exists():
            # Someone named their ordinary account "admin": never take it over.
            username = f"admin-{secrets.token_hex(3)}"
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username, "", password)
        self.stdout.write(
            self.style.WARNING(
                f"Created the admin user: {username} / {password}  "
                "(shown only this once; change it in the admin)"
            )
        )
