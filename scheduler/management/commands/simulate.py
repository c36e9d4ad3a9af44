"""Run the real policy, self-swapping servers and a serial FIFO on a trace, on a virtual clock."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from scheduler.simulation import PolicyLivelock, Result, simulate_fifo, simulate_policy
from scheduler.simulation_history import trace_from_history
from scheduler.simulation_mixed_day import generate_mixed_day
from scheduler.simulation_swap import simulate_self_swapping
from scheduler.simulation_targets import report, targets
from scheduler.simulation_workload import (
    CLASS_NAMES,
    Workload,
    WorkloadError,
    generate_day,
    read_workload,
    write_workload,
)
from scheduler.store import policy_config


class Command(BaseCommand):
    help = (
        "Simulate the scheduling policy against self-swapping servers and a one-worker FIFO "
        "on a trace (a file, this installation's own history, or else the default day) and "
        "print waits per class, loads, expired and lost requests, and the targets against "
        "self-swapping servers."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "trace", nargs="?", help="a JSON trace (scheduler/simulation_workload.py)"
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the generated day")
        parser.add_argument(
            "--hours", type=float, default=24.0, help="generate only the first hours of the day"
        )
        parser.add_argument(
            "--day",
            choices=("default", "mixed"),
            default="default",
            help="which day to generate: the default one, or the mixed one"
            " (a heartbeat flood, batch waves, models with two homes)",
        )
        parser.add_argument(
            "--history",
            type=float,
            metavar="HOURS",
            help="replay this installation's own requests of the last HOURS on its servers"
            " and models as they are now (scheduler/simulation_history.py)",
        )
        parser.add_argument(
            "--write-trace", metavar="PATH", help="save the generated (or history's) trace here"
        )

    def handle(self, *args, **options) -> None:
        trace, source = self.trace(options)
        if options["write_trace"] and not options["trace"]:
            write_workload(trace, options["write_trace"])
        try:
            policy = simulate_policy(trace, policy_config())
        except PolicyLivelock as error:
            raise CommandError(f"the policy did not settle: {error}") from error
        fifo = simulate_fifo(trace)
        swap = simulate_self_swapping(trace)
        self.stdout.write(
            f"{len(trace.requests)} requests ({source}), {len(trace.servers)} servers, "
            f"{len(trace.models)} models\n"
        )
        self.stdout.write(comparison_table([policy, swap, fifo]))
        self.stdout.write(f"ETA given on arrival, checked when sent: {policy.eta.summary()}\n")
        self.stdout.write("Targets against self-swapping servers:\n")
        self.stdout.write(report(targets(policy, swap)))

    def trace(self, options: dict) -> tuple[Workload, str]:
        """The trace to replay, and what to call it."""
        if options["trace"] and options["history"] is not None:
            raise CommandError("give a trace file or --history, not both")
        if options["trace"]:
            try:
                return read_workload(options["trace"]), options["trace"]
            except WorkloadError as error:
                raise CommandError(str(error)) from error
        if options["history"] is not None:
            return self.history(options["history"])
        generate = generate_mixed_day if options["day"] == "mixed" else generate_day
        day, seed, hours = options["day"], options["seed"], options["hours"]
        return generate(seed, hours), f"generated {day} day, seed {seed}, {hours:g} hours"

    def history(self, hours: float) -> tuple[Workload, str]:
        if hours <= 0:
            raise CommandError(f"--history takes a positive number of hours, not {hours:g}")
        until = timezone.now()
        found = trace_from_history(until - timedelta(hours=hours), until)
        if not found.trace.requests:
            raise CommandError(f"no requests in the last {hours:g} hours to replay")
        filled = "; ".join(f"{what} ({n})" for what, n in sorted(found.gaps.items()))
        if filled:
            self.stdout.write(f"Filled in where the rows say nothing: {filled}\n")
        if found.left_out:
            self.stdout.write(
                f"Left out: {found.left_out} requests for models no enabled server serves\n"
            )
        return found.trace, f"this installation's last {hours:g} hours"


def comparison_table(results: list[Result]) -> str:
    rows: list[tuple[str, ...]] = [("", *(r.name for r in results))]
    for priority, name in CLASS_NAMES.items():
        for q in (50, 95):
            rows.append(
                (f"{name} wait p{q}", *(_seconds(r.wait_percentile(priority, q)) for r in results))
            )
    rows.append(("loads", *(str(r.loads) for r in results)))
    rows.append(("loads stopped", *(str(r.stopped) for r in results)))
    rows.append(("restores started", *(str(r.restores) for r in results)))
    for priority, name in CLASS_NAMES.items():
        rows.append((f"expired {name}", *(str(r.count("expired", priority)) for r in results)))
    rows.append(("failed", *(str(r.count("failed")) for r in results)))
    rows.append(("lost", *(str(r.lost) for r in results)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"
