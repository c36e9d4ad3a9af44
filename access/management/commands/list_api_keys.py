"""python manage.py list_api_keys: every key by name, with its state and limits; never a
secret (only its public prefix, as the admin shows it)."""

from django.core.management.base import BaseCommand
from django.utils import timezone

from access.models import KEY_MARK, ApiKey
from scheduler.models import Priority

HEADER = ("KEY", "NAME", "TEAM", "STATE", "OPERATOR", "MAX CLASS", "LIMITS", "CREATED")


def key_state(key: ApiKey, now) -> str:
    if key.revoked:
        return "revoked"
    if key.expires_at is not None:
        when = timezone.localtime(key.expires_at).strftime("%Y-%m-%d %H:%M")
        return f"expired {when}" if key.expires_at <= now else f"expires {when}"
    return "active"


def limits(key: ApiKey) -> str:
    """Its own limits, as `create_api_key`'s options name them; "-" for none."""
    said = [
        f"{flag}={value}"
        for flag, value in (
            ("models", ",".join(key.allowed_models)),
            ("rpm", key.rpm),
            ("max-waiting", key.max_waiting),
            ("max-processing", key.max_processing),
            ("daily-seconds", key.daily_processing_s),
            ("daily-tokens", key.daily_tokens),
            ("weight", key.weight if key.weight != 1 else None),
        )
        if value not in (None, "")
    ]
    return " ".join(said) or "-"


class Command(BaseCommand):
    help = "List the API keys: prefix, name, team, state, operator flag, highest class, limits."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--usable", action="store_true", help="only keys neither revoked nor expired"
        )

    def handle(self, *args, **options) -> None:
        now = timezone.now()
        keys = ApiKey.objects.select_related("team")
        rows = [
            (
                f"{KEY_MARK}{k.prefix}",
                k.name,
                k.team.name if k.team else "-",
                key_state(k, now),
                "yes" if k.operator else "no",
                Priority(k.max_priority).label,
                limits(k),
                timezone.localtime(k.created_at).strftime("%Y-%m-%d %H:%M"),
            )
            for k in keys
            if not options["usable"] or k.is_usable(now)
        ]
        if not rows:
            self.stdout.write("No API keys." if not options["usable"] else "No usable API keys.")
            return
        widths = [max(len(str(r[i])) for r in [HEADER, *rows]) for i in range(len(HEADER))]
        for row in [HEADER, *rows]:
            line = "  ".join(
                str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
            )
            self.stdout.write(line.rstrip())
