"""The frozen picture of the world the policy decides on. No Django in here."""

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The policy's knobs; `scheduler/README.md` explains each one."""

    aging_step_s: float = 150.0
    min_residency_s: float = 30.0
    warm_window_s: float = 120.0
    normal_warm_window_s: float = 60.0
    """The warm window for normal switches (a normal request's own tail is a load's time)."""
    activity_window_s: float = 300.0
    default_load_s: float = 10.0
    default_run_s: float = 10.0
    """Run time assumed for a request, to price how long a model's queue takes to drain."""
    parallel_load_queue: int = 2
    """Start a load on a second server once this many requests queue for a busy model."""
    no_server_grace_s: float = 15.0
    """A request whose model no server can serve now fails after this long."""
    urgent_load_s: float = 20.0
    """A request whose load must start within this long to be served before it expires
    passes the holds (`holding.rescue_pays`)."""
    restore_window_s: float = 3600.0
    """An idle server that can stop a load loads back a model interactive work used within
    this long (`housekeeping.restore`); 0 turns restores off."""
    rescue_s: float = 30.0
    """A request this close to its expiry goes first (earliest expiry first)."""
    time_zone: str = "UTC"
    """The zone deployments' keep-loaded hours are read in."""


@dataclass(frozen=True, slots=True)
class DeploymentView:
    id: int
    server_id: int
    model: str
    model_type: str = "llm"
    state: str = "unloaded"
    in_flight: int = 0
    slots: int | None = None
    """Requests of this model its server serves at once; None: as many as the server's."""
    size_mb: int | None = None
    device: str = "gpu"
    pinned: bool = False
    preload: bool = False
    keep_loaded_hours: str = ""
    """When to keep it loaded (`backends.keep_loaded`), in `PolicyConfig.time_zone`."""
    idle_ttl_s: float | None = None
    loaded_at: datetime | None = None
    last_used_at: datetime | None = None
    last_interactive_at: datetime | None = None
    load_cause: str = ""
    """Who asked for its last load ("request", "restore", "preload", "operator", "outside")."""
    displaced: bool = False
    """Unloaded by Switchyard to make room for another load (a restore may bring it back)."""
    last_priority: int | None = None
    avg_load_s: float | None = None
    """Its measured average load time; before one is measured, what to expect of its first
    load where there is a basis (`load_estimate.with_expected_loads`), else None."""
    load_failures: int = 0
    next_load_at: datetime | None = None
    last_error_code: str = ""
    last_error: str = ""
    load_started_at: datetime | None = None
    """When its load under way started (a wait reason says how far it is)."""
    avg_inference_s: float | None = None
    """The measured average run time of a request here (None before one ended)."""
    enabled: bool = True
    """Off (an operator's choice): nothing routed or loaded here; unloaded once idle."""
    expected_load_s: int | None = None
    """What its operator says its load takes, until one is measured (`load_estimate`)."""

    @property
    def occupies_room(self) -> bool:
        return self.state in ("loading", "loaded", "unloading")


def used_since_loaded(d) -> bool:
    """A request was sent to it since its load finished (a load stamps both times)."""
    return d.loaded_at is not None and d.last_used_at is not None and d.last_used_at > d.loaded_at


def unused_since_loaded(d) -> bool:
    """Loaded, and no request sent to it since: the policy keeps it for one that waited
    (no wasted load)."""
    return d.state == "loaded" and not used_since_loaded(d)


def unused_restore(d) -> bool:
    """Loaded by a restore on idle and not used by a request since: a guess that holds no
    real work back. `d` is a `DeploymentView`, or a `backends.Deployment` (the dashboard)."""
    return unused_since_loaded(d) and d.load_cause == "restore" and d.loaded_at is not None


@dataclass(frozen=True, slots=True)
class ServerView:
    id: int
    name: str
    slots: int = 1
    capacity: dict[str, int] = field(default_factory=lambda: {"llm": 1})
    max_models: int | None = None
    """Models of every type together it holds at once (None: only each type's count)."""
    memory_mb: int | None = None
    enabled: bool = True
    health: str = "up"
    cooldown_until: datetime | None = None
    unavailable_since: datetime | None = None
    """When it last went down, disabled or into cooldown, if known: the no-server grace
    counts from then for requests older than that."""
    stops_loads: bool = False
    """Its server kind can stop a load under way (its adapter's `stops_loads`): a load that
    nobody waits for any more then gives way to one somebody does (`StopLoad`)."""

    def available(self, now: datetime) -> bool:
        if not self.enabled or self.health == "down":
            return False
        return self.cooldown_until is None or self.cooldown_until <= now


@dataclass(frozen=True, slots=True)
class RequestView:
    id: UUID
    model: str
    priority: int
    state: str
    created_at: datetime
    expires_at: datetime
    deployment_id: int | None = None
    not_before: datetime | None = None
    no_server_grace_s: float | None = None
    """How long this request waits while no server can serve its model (None: the
    config's `no_server_grace_s`); a job may ask for longer."""
    api_key: int | None = None
    """The id of the API key that sent it; None with SWITCHYARD_AUTH=off."""
    cache_server: int | None = None
    """The server its conversation's last turn ran on, whose prompt cache may still hold
    it: preferred while it has a free slot (`policy._Pass.least_busy`)."""


@dataclass(frozen=True, slots=True)
class KeyView:
    """An API key, as fair share and its processing quota see it."""

    id: int
    weight: int = 1
    max_processing: int | None = None
    processing: int = 0
    """Its requests processing now."""
    team: int | None = None
    """The id of its team (`TeamView`), if any."""
    last_served: int = 0
    """When a request of its last left the line, as a count of passes (0: not seen to): its
    team's tie-break. Set by the runtime from the passes it made (`runtime.keys_served`)."""


@dataclass(frozen=True, slots=True)
class TeamView:
    """A team of API keys, as fair share and its processing quota see it."""

    id: int
    weight: int = 1
    max_processing: int | None = None
    processing: int = 0
    """The requests of all its keys processing now."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    servers: tuple[ServerView, ...]
    deployments: tuple[DeploymentView, ...]
    requests: tuple[RequestView, ...]
    """Waiting requests only (pending, needs_loading, ready)."""
    config: PolicyConfig = PolicyConfig()
    keys: tuple[KeyView, ...] = ()
    """The API keys with requests waiting or processing (any others: weight 1, no quota)."""
    teams: tuple[TeamView, ...] = ()
    """The teams of those keys."""
    unseen: frozenset[str] = frozenset()
    """Models that more requests may wait for than `requests` holds. Of a deep line it holds
    the heads: its best, its oldest, and the best of each deployed model's own line, so a
    deployed model with fewer of those here than such a head holds has every one here."""
