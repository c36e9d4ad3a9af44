"""What the policy can decide: a small closed set of frozen dataclasses.

The runtime has exactly one place that executes each kind (`Runtime.execute`).
"""

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID


@dataclass(frozen=True, slots=True)
class Expire:
    request_id: UUID
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    request_id: UUID
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Route:
    """pending → ready (model loaded there) or → needs_loading (joins or awaits a load)."""

    request_id: UUID
    deployment_id: int
    ready: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Requeue:
    """Back to pending, to be routed again (its deployment went away)."""

    request_id: UUID
    reason: str
    deployment_id: int | None = None
    """The deployment it leaves (its trace row names that server)."""


@dataclass(frozen=True, slots=True)
class MarkReady:
    """needs_loading → ready: the load it waited for, of `deployment_id`, is done."""

    request_id: UUID
    deployment_id: int


@dataclass(frozen=True, slots=True)
class StartLoad:
    """Load a deployment, unloading `evict` first (chosen now, when the load starts)."""

    deployment_id: int
    evict: tuple[int, ...]
    reason: str
    cause: str = "request"
    """Who asked: "request" (requests wait for it), "restore" (`housekeeping.restore`),
    "preload" or "operator" (a load intent). Stored on the deployment as `load_cause`."""


@dataclass(frozen=True, slots=True)
class Unload:
    deployment_id: int
    reason: str
    if_unused: bool = False
    """Only if its server runs nothing on it (its idle TTL): a server that can say so may
    be running requests Switchyard did not send."""


@dataclass(frozen=True, slots=True)
class StopLoad:
    """Stop the load under way of `deployment_id`, which nobody waits for any more, so that
    its server's one load channel frees for a load someone does wait for. Only on servers
    that can stop a load (`ServerView.stops_loads`); it ends `unloaded`."""

    deployment_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    """ready → processing on `deployment_id`: the one it was routed to, or another server's
    deployment of the same model that has a free slot (a busy queue drains onto it)."""

    request_id: UUID
    deployment_id: int


@dataclass(frozen=True, slots=True)
class SendNext:
    """When a slot frees on `server_id` (its requests all busy now), send `request_id` to
    `deployment_id`: what a pass would send to that slot, known before it frees. The worker
    sends it in the write that frees the slot, without waiting for a pass; one sent
    elsewhere meanwhile, or gone, is left to the pass. Not past `expires_at`, nor once a
    request of a better class than `effective_priority` (its class after aging) arrived."""

    server_id: int
    request_id: UUID
    deployment_id: int
    expires_at: datetime
    effective_priority: int
    api_key: int | None = None
    """Its API key (fair share: a request of another key, of the same class, may go first)."""


@dataclass(frozen=True, slots=True)
class SendOnArrival:
    """`model` is loaded on `deployment_id` with `room` free slots on its server, and no
    request left waiting could use that server: a request for it that arrives before the
    next pass goes straight there, as that pass would route and send it, without waiting
    for one. The worker counts the room down as it sends and up as requests there end; one
    send the database refuses (the slot or the model gone meanwhile) and the next pass
    decides."""

    model: str
    deployment_id: int
    server_id: int
    room: int


@dataclass(frozen=True, slots=True)
class Probe:
    """The server's cooldown is over: one health check decides if it is back."""

    server_id: int


@dataclass(frozen=True, slots=True)
class Defer:
    """Nothing to do about something until `until`: wake the loop then."""

    until: datetime
    reason: str


Decision = (
    Expire
    | Fail
    | Route
    | Requeue
    | MarkReady
    | StartLoad
    | Unload
    | StopLoad
    | Dispatch
    | SendNext
    | SendOnArrival
    | Probe
    | Defer
)
