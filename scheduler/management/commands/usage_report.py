"""python manage.py usage_report [--since D] [--until D] [--by key,team,day] [--csv]: what
keys and teams used, as `GET /api/v1/usage` answers it."""

from django.core.management.base import BaseCommand, CommandError

from access.usage import FIELDS
from scheduler.api.errors import ApiError
from scheduler.api.usage import columns, csv_text, report


class Command(BaseCommand):
    help = "Print what API keys and teams used, by key, team and/or day (UTC days)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--since", help="first UTC day, as 2026-11-01 (30 days before until)")
        parser.add_argument("--until", help="last UTC day, included (today)")
        parser.add_argument("--by", default="key", help="key, team, day, or several: team,day")
        parser.add_argument("--key", help="only this key's requests (its prefix)")
        parser.add_argument("--team", help="only those of this team's keys")
        parser.add_argument("--csv", action="store_true", help="as CSV, for a spreadsheet")

    def handle(self, *args, csv: bool, **options) -> None:
        asked = {name: options[name] for name in ("since", "until", "by", "key", "team")}
        try:
            rows, summary, by = report({k: v for k, v in asked.items() if v})
        except ApiError as error:
            raise CommandError(str(error)) from None
        if csv:
            self.stdout.write(csv_text(rows, by), ending="")
            return
        names = columns(by)
        grouped = len(names) - len(FIELDS)  # the columns before the figures
        table = [names, *([_cell(row[n]) for n in names] for row in rows)]
        table.append(
            ["total", *[""] * (grouped - 1), *(_cell(summary["total"][n]) for n in FIELDS)]
        )
        widths = [max(len(line[i]) for line in table) for i in range(len(names))]
        self.stdout.write(f"Usage from {summary['since']} to {summary['until']} (UTC days)")
        for line in table:
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            )


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
