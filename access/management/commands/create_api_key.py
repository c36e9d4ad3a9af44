"""python manage.py create_api_key NAME [limits]: prints the key's webhook secret, then the
new key alone on its last line."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from access.models import STREAM_PROGRESS, ApiKey, Team
from scheduler.models import Priority

CLASSES = [p.label for p in Priority]


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = "Create an API key and print it (shown once; only its hash is kept)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="who or what uses it")
        parser.add_argument("--max-priority", choices=CLASSES, default="interactive")
        parser.add_argument("--default-priority", choices=CLASSES, default="normal")
        parser.add_argument(
            "--models", default="", help="comma-separated model names; default: all"
        )
        parser.add_argument("--rpm", type=int, help="requests per minute")
        parser.add_argument("--max-waiting", type=int, help="most requests waiting at once")
        parser.add_argument("--max-processing", type=int, help="most processing at once")
        parser.add_argument(
            "--daily-seconds", type=positive, help="processing seconds it may use a day (UTC)"
        )
        parser.add_argument("--daily-tokens", type=positive, help="tokens it may use a day (UTC)")
        parser.add_argument("--weight", type=positive, default=1, help="fair-share weight")
        parser.add_argument(
            "--team",
            help="the team it belongs to, made if there is none of that name (its share and"
            " quotas are set in the admin)",
        )
        parser.add_argument("--operator", action="store_true", help="may use the operator API")
        parser.add_argument(
            "--expires-in", type=positive, metavar="DAYS", help="refused after this many days"
        )
        parser.add_argument(
            "--stream-progress",
            choices=STREAM_PROGRESS,
            default="",
            help="how its streamed chats show their wait; default: SWITCHYARD_STREAM_PROGRESS",
        )

    def handle(self, *args, **options) -> None:
        for limit in ("rpm", "max_waiting", "max_processing"):
            if options[limit] is not None and options[limit] < 0:
                raise CommandError(f"--{limit.replace('_', '-')} must be 0 or more")
        models = [m.strip() for m in options["models"].split(",") if m.strip()]
        team = None
        if options["team"] is not None:
            if not options["team"].strip():
                raise CommandError("--team needs a name")
            team, made = Team.objects.get_or_create(name=options["team"].strip())
            if made:
                self.stdout.write(f"Created team {team} (weight 1, no quotas: see the admin)")
        api_key, secret = ApiKey.generate(
            options["name"],
            max_priority=CLASSES.index(options["max_priority"]),
            default_priority=CLASSES.index(options["default_priority"]),
            allowed_models=models,
            rpm=options["rpm"],
            max_waiting=options["max_waiting"],
            max_processing=options["max_processing"],
            weight=options["weight"],
            daily_processing_s=options["daily_seconds"],
            daily_tokens=options["daily_tokens"],
            operator=options["operator"],
            stream_progress=options["stream_progress"],
            team=team,
            expires_at=timezone.now() + timedelta(days=options["expires_in"])
            if options["expires_in"]
            else None,
        )
        api_key.save()
        self.stdout.write(
            "Its webhook secret (signs the callbacks of its jobs; shown once, rotate it in the"
            f" admin): {api_key.webhook_secret}"
        )
        self.stdout.write(
            f"Created API key {api_key} (shown once; only its hash is kept). Send it as"
            " `Authorization: Bearer <key>`:"
        )
        self.stdout.write(secret)
