"""python manage.py revoke_api_key sy-1a2b3c4d [--restore]: refuse a key from now on (or
take it back), as the admin's Revoke and Restore actions do."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from access.models import KEY_MARK, ApiKey


def prefix_of(given: str) -> str:
    """The public prefix, from the prefix as the admin and `list_api_keys` show it
    (`sy-1a2b3c4d`, the mark optional) or from the whole key."""
    return given.strip().removeprefix(KEY_MARK).split(".", 1)[0]


class Command(BaseCommand):
    help = "Revoke an API key (its prefix, as list_api_keys shows it, or the whole key)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("key", help="the key's prefix (sy-1a2b3c4d) or the whole key")
        parser.add_argument("--restore", action="store_true", help="take a revocation back")

    def handle(self, *args, **options) -> None:
        key = ApiKey.objects.filter(prefix=prefix_of(options["key"])).first()
        if key is None:
            raise CommandError(f"No API key {options['key']!r} (see list_api_keys).")
        revoked = not options["restore"]
        if key.revoked == revoked:
            self.stdout.write(f"{key} is already {'revoked' if revoked else 'not revoked'}.")
            return
        ApiKey.objects.filter(pk=key.pk).update(revoked=revoked)
        within = settings.SWITCHYARD["AUTH_CACHE_S"]
        if revoked:
            self.stdout.write(f"Revoked {key}: refused on every web process within {within:g} s.")
        else:
            self.stdout.write(f"Restored {key}: accepted again within {within:g} s.")
