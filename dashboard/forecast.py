"""The live ETA: the database's picture fed to the pure forecast (`scheduler/eta.py`).

A fixed number of reads: servers, deployments, the requests running now, the head of the
line (at most `limit` rows, in the policy's order) and the quotas of its callers. Rows
further back are never ahead of these, so the head's ETAs do not depend on them."""

from dataclasses import dataclass
from datetime import datetime

from access.models import ApiKey
from access.usage import TOKEN_CAPS
from backends.models import Deployment, Server
from scheduler.eta import (
    Cap,
    Host,
    Place,
    Waiter,
    expected_run_s,
    forecast,
    line_order,
    load_left_s,
)
from scheduler.load_estimate import expected_loads
from scheduler.models import WAITING_STATES, Request, State
from scheduler.reasons import not_before
from scheduler.reasons_shown import server_fraction
from scheduler.snapshot import unused_since_loaded
from scheduler.store.knobs import policy_config

from .models import RunStat

DEFAULT_LOAD_S = 10.0  # the policy's default, for a model never loaded here
LINE_READ = 1000


def available(s: Server, now: datetime) -> bool:
    if not s.enabled or s.health == "down":
        return False
    return s.cooldown_until is None or s.cooldown_until <= now


def hosts_and_places(
    now: datetime, runs: "Runs"
) -> tuple[list[Host], list[Place], list[tuple[Request, float]]]:
    """The servers and deployments as the forecast sees them, and each running request
    with what is left of its run."""
    busy: dict[int, list[Request]] = {}
    running = Request.objects.filter(state=State.PROCESSING).only(
        "deployment_id", "started_at", "model_id", "priority", "payload", "api_key_id"
    )
    running_left: list[tuple[Request, float]] = []
    for r in running:
        busy.setdefault(r.deployment_id, []).append(r)
    hosts = [
        Host(s.pk, s.slots, s.room, available(s, now), s.max_models) for s in Server.objects.all()
    ]
    places = []
    deployments = list(Deployment.objects.select_related("model"))
    expected = expected_loads(deployments, lambda d: d.model_id)
    means = run_means(deployments)
    # A load under way where something unloads has not begun: that is its victims, and the
    # server may first let what others sent them finish (OUTSIDE_GRACE_S).
    unloading = {d.server_id for d in deployments if d.state == "unloading"}
    for i, d in enumerate(deployments):
        load_s = d.avg_load_s or expected.get(i) or DEFAULT_LOAD_S
        run_s = d.avg_inference_s or expected_run_s(means, d.model_id)
        left = 0.0
        if d.state == "loading" and d.server_id in unloading:
            left = load_s
        elif d.state == "loading" and d.load_started_at:
            elapsed = (now - d.load_started_at).total_seconds()
            left = load_left_s(load_s, elapsed, server_fraction(d))
        here = busy.get(d.pk, [])
        busy_s = tuple(runs.left_s(r, run_s, now) for r in here)
        running_left.extend(zip(here, busy_s, strict=True))
        places.append(
            Place(
                id=d.pk,
                server_id=d.server_id,
                model=d.model_id,
                state=d.state,
                load_s=load_s,
                run_s=run_s,
                model_type=d.model.type,
                load_left_s=left,
                busy_s=busy_s,
                idle_s=(now - d.last_used_at).total_seconds() if d.last_used_at else 1e9,
                slots=d.slots,
                fresh=unused_since_loaded(d),
            )
        )
    return hosts, places, running_left


def quota_caps(
    waiting: list[Request], running: list[tuple[Request, float]]
) -> tuple[list[Cap], dict[int, tuple]]:
    """The quotas (`max_processing`) of the waiting requests' keys and of their teams, each
    with what is left of the runs of its requests at servers now; and each key's own."""
    keys = {r.api_key_id for r in waiting if r.api_key_id is not None}
    if not keys:
        return [], {}
    keys |= {r.api_key_id for r, _ in running if r.api_key_id is not None}
    rows = ApiKey.objects.filter(pk__in=keys).values_list(
        "pk", "max_processing", "team_id", "team__max_processing"
    )
    limits: dict[tuple, int] = {}
    of_key: dict[int, tuple] = {}
    for key, key_most, team, team_most in rows:
        own = [("key", key, key_most), ("team", team, team_most)]
        of_key[key] = tuple((kind, i) for kind, i, most in own if most is not None)
        limits.update(((kind, i), most) for kind, i, most in own if most is not None)
    busy: dict[tuple, list[float]] = {cap: [] for cap in limits}
    for r, left in running:
        for cap in of_key.get(r.api_key_id, ()):
            busy[cap].append(left)
    return [Cap(cap, most, tuple(busy[cap])) for cap, most in limits.items()], of_key


def run_means(deployments: list[Deployment]) -> dict[int, float]:
    """Each model's mean run time over the servers where it has run: what it is expected to
    run on one where it has not (`eta.expected_run_s`, as `manage.py simulate` expects)."""
    runs: dict[int, list[float]] = {}
    for d in deployments:
        if d.avg_inference_s:
            runs.setdefault(d.model_id, []).append(d.avg_inference_s)
    return {model: sum(v) / len(v) for model, v in runs.items()}


def first_load_s(d: Deployment) -> float | None:
    """What a deployment never measured is expected to take to load (`load_estimate`: the
    operator's figure, else the same model elsewhere, else its size at its server's speed);
    None without a basis. One small read of every deployment, made only for such a load
    under way."""
    rows = list(
        Deployment.objects.only(
            "id", "server_id", "model_id", "size_mb", "avg_load_s", "expected_load_s"
        )
    )
    at = next((i for i, row in enumerate(rows) if row.pk == d.pk), None)
    return None if at is None else expected_loads(rows, lambda row: row.model_id).get(at)


@dataclass(frozen=True, slots=True)
class Runs:
    """Expected run times per model and class, as the history task keeps them (a class's
    requests run longer or shorter than the model's average: a burst of short background
    jobs, long interactive chats), with their token lines (`eta.token_line`) and the mean
    length of their answers that no cap cut short."""

    run_s: dict[tuple[int, int], float]
    lines: dict[tuple[int, int], tuple[float, float]]
    natural: dict[tuple[int, int], float]

    @classmethod
    def read(cls) -> "Runs":
        """A few rows: one per model and class that ran."""
        rows = RunStat.objects.values_list(
            "model_id", "priority", "run_s", "base_s", "token_s", "natural_tokens"
        )
        run_s, lines, natural = {}, {}, {}
        for model_id, priority, run, base, token, tokens in rows:
            run_s[(model_id, priority)] = run
            if base is not None and token is not None:
                lines[(model_id, priority)] = (base, token)
            if tokens:
                natural[(model_id, priority)] = tokens
        return cls(run_s, lines, natural)

    def tokens_s(self, model_id: int, priority: int, payload: object) -> float | None:
        """A request's expected run on its model and class's token line (of its model's
        other classes, before its own has one): for as many tokens as their answers end
        by themselves with, or as it asks for at most if fewer (a request for 16 tokens
        among 200-token answers is over sooner). None without a line, or with neither
        count of tokens known."""
        line = _own_or_mean(self.lines, model_id, priority)
        if line is None:
            return None
        natural = _own_or_mean(self.natural, model_id, priority)
        asked = asked_tokens(payload)
        tokens = min(asked, natural) if asked and natural else (asked or natural)
        return None if tokens is None else line[0] + tokens * line[1]

    def expected_s(self, r: Request, otherwise: float | None = None) -> float | None:
        """A request's expected run: from tokens where known (`tokens_s`), else its model
        and class's run time, else `otherwise`."""
        by_tokens = self.tokens_s(r.model_id, r.priority, r.payload)
        if by_tokens is not None:
            return by_tokens
        return self.run_s.get((r.model_id, r.priority), otherwise)

    def left_s(self, r: Request, run_s: float, now: datetime) -> float:
        """What is left of a running request's run: as `expected_s` expects it, else
        `run_s` (its deployment's)."""
        expected = self.expected_s(r, run_s)
        assert expected is not None  # `run_s` stands in
        return max(expected - (now - (r.started_at or now)).total_seconds(), 0.0)


def _own_or_mean(found: dict, model_id: int, priority: int):
    """The model and class's own figure, else the mean over the model's other classes
    (a number, or a tuple of numbers taken part by part), else None."""
    if (model_id, priority) in found:
        return found[(model_id, priority)]
    others = [v for (m, _), v in found.items() if m == model_id]
    if not others:
        return None
    if isinstance(others[0], tuple):
        return tuple(sum(parts) / len(others) for parts in zip(*others, strict=True))
    return sum(others) / len(others)


def asked_tokens(payload: object) -> int | None:
    """The most tokens a request lets its answer have, if it says (`usage.TOKEN_CAPS`)."""
    if not isinstance(payload, dict):
        return None
    for name in TOKEN_CAPS:
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def held_s(reason: dict | None, now: datetime) -> float:
    """Seconds until its stored reason lets it go (a hold, a retry's backoff), else 0."""
    until = not_before(reason)
    return max((until - now).total_seconds(), 0.0) if until else 0.0


@dataclass(frozen=True, slots=True)
class Line:
    """The head of the line in the policy's order, with each one's place and ETA."""

    requests: list[Request]
    etas: dict
    total: int | None = None

    def position(self, r: Request) -> int:
        return self.requests.index(r) + 1


def head(now: datetime, limit: int = LINE_READ, related: bool = False) -> Line:
    rows = Request.objects.filter(state__in=WAITING_STATES).order_by("priority", "created_at", "id")
    if related:
        rows = rows.select_related("server", "deployment", "api_key__team")
    config = policy_config()
    read = list(rows[:limit])
    classes = {
        r.pk: line_order(r.priority, (now - r.created_at).total_seconds(), config.aging_step_s)
        for r in read
    }
    requests = sorted(read, key=lambda r: (classes[r.pk], r.created_at, str(r.pk)))
    runs = Runs.read()
    hosts, places, running = hosts_and_places(now, runs)
    caps, of_key = quota_caps(requests, running)
    line = [
        Waiter(
            r.pk,
            r.model_id,
            r.deployment_id,
            runs.expected_s(r),
            held_s(r.reason, now),
            classes[r.pk],
            of_key.get(r.api_key_id, ()),
        )
        for r in requests
    ]
    return Line(requests, forecast(hosts, places, line, config=config, caps=caps))
