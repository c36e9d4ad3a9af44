"""Run the real policy and a serial FIFO baseline on a trace, on a virtual clock; print both."""

from django.core.management.base import BaseCommand, CommandError

from scheduler.simulation import PolicyLivelock, Result, simulate_fifo, simulate_policy
from scheduler.simulation_mixed_day import generate_mixed_day
from scheduler.simulation_swap import simulate_self_swapping
from scheduler.simulation_targets import report, targets
from scheduler.simulation_workload import (
    CLASS_NAMES,
    WorkloadError,
    generate_day,
    read_workload,
    write_workload,
)
from scheduler.store import policy_config


class Command(BaseCommand):
    help = (
        "Simulate the scheduling policy against self-swapping servers and a one-worker FIFO "
        "on a trace (the default day when no file is given) and print waits per class, loads, "
        "expired and lost requests, and the targets against self-swapping servers."
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
        parser.add_argument("--write-trace", metavar="PATH", help="save the generated day here")

    def handle(self, *args, **options) -> None:
        try:
            trace = read_workload(options["trace"]) if options["trace"] else None
        except WorkloadError as error:
            raise CommandError(str(error)) from error
        if trace is None:
            generate = generate_mixed_day if options["day"] == "mixed" else generate_day
            trace = generate(options["seed"], options["hours"])
            if options["write_trace"]:
                write_workload(trace, options["write_trace"])
        try:
            policy = simulate_policy(trace, policy_config())
        except PolicyLivelock as error:
            raise CommandError(f"the policy did not settle: {error}") from error
        fifo = simulate_fifo(trace)
        swap = simulate_self_swapping(trace)
        source = options["trace"] or (
            f"generated {options['day']} day, seed {options['seed']}, {options['hours']:g} hours"
        )
        self.stdout.write(
            f"{len(trace.requests)} requests ({source}), {len(trace.servers)} servers, "
            f"{len(trace.models)} models\n"
        )
        self.stdout.write(comparison_table([policy, swap, fifo]))
        self.stdout.write(f"ETA given on arrival, checked when sent: {policy.eta.summary()}\n")
        self.stdout.write("Targets against self-swapping servers:\n")
        self.stdout.write(report(targets(policy, swap)))


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
