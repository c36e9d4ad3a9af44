"""Delete finished requests (and their traces) older than a number of days, now."""

from django.core.management.base import BaseCommand, CommandError

from scheduler.retention import cutoff, finished_before, keep_days, purge_finished


class Command(BaseCommand):
    help = (
        "Delete the requests that finished (completed, failed, cancelled or expired) more than "
        "DAYS ago, with their traces; waiting and running requests are never touched. The "
        "worker does the same by itself with SWITCHYARD_KEEP_FINISHED_DAYS."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--days",
            type=float,
            default=None,
            help="keep what finished more recently than this (default: "
            "SWITCHYARD_KEEP_FINISHED_DAYS)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would go, delete nothing"
        )

    def handle(self, *args, **options) -> None:
        before = cutoff(options["days"])
        if before is None:
            raise CommandError(
                "--days must be more than 0 (SWITCHYARD_KEEP_FINISHED_DAYS=0 keeps them forever)"
            )
        days = keep_days() if options["days"] is None else options["days"]
        if options["dry_run"]:
            count = finished_before(before)
            self.stdout.write(f"{count} requests finished more than {days:g} days ago")
            return
        count = purge_finished(before)
        self.stdout.write(f"deleted {count} requests that finished more than {days:g} days ago")
