"""The runtime's database side: reading the snapshot and committing what tasks report.

One module per concern; the names the runtime uses are re-exported here, so callers write
`store.dispatch_all(...)`. All functions are synchronous; the runtime calls them in its
database thread (`database_thread`).

- `knobs`: the settings the runtime reads and the policy's configuration.
- `queries`: the hot path's raw SQL, as named statements.
- `snapshots`: reading what the policy plans on.
- `workers`: leases, heartbeats, taking over a stale worker's requests.
- `loads`: loads and unloads of deployments.
- `dispatch`: sending requests to their deployments.
- `completion`: a request's end on its server, or its cancel.
- `health`: server health, probes and status sync.
- `reasons`: why requests wait, stored as it changes.
"""

from .completion import (
    Answer,
    PlannedSend,
    cancel_request,
    cancel_requests,
    request_failed,
    requests_completed,
)
from .dispatch import (
    LoadedDeployment,
    Sending,
    SentRequest,
    ServeJob,
    dispatch_all,
    move_and_dispatch,
    send_on_arrival,
)
from .health import (
    all_servers,
    apply_server_models,
    learn_room,
    mark_down,
    open_breaker,
    probe_result,
    recheck_deployment,
    seen_used,
    server_failed,
    server_for_adapter,
    server_name,
    server_succeeded,
)
from .knobs import knob, policy_config
from .loads import (
    LoadJob,
    StopJob,
    evicted,
    load_called_off,
    load_failed,
    load_succeeded,
    load_wanted,
    server_of_deployment,
    set_load_progress,
    start_load,
    start_unload,
    stop_load,
    unload_called_off,
)
from .queries import HEAD_SQL, IN_INDEX_ORDER
from .reasons import ReasonWriter, write_reasons
from .snapshots import MODEL_HEAD, SNAPSHOT_HEAD, SnapshotReader, pass_reads
from .workers import (
    heartbeat,
    orphaned_deployments,
    passes_failing,
    recount_in_flight,
    register_worker,
    release_worker,
    take_over_stale_workers,
    workers_beside_simulated,
)

__all__ = [
    "HEAD_SQL",
    "IN_INDEX_ORDER",
    "MODEL_HEAD",
    "SNAPSHOT_HEAD",
    "Answer",
    "PlannedSend",
    "LoadJob",
    "LoadedDeployment",
    "ReasonWriter",
    "Sending",
    "SentRequest",
    "ServeJob",
    "SnapshotReader",
    "StopJob",
    "all_servers",
    "apply_server_models",
    "cancel_request",
    "cancel_requests",
    "dispatch_all",
    "evicted",
    "heartbeat",
    "knob",
    "learn_room",
    "load_called_off",
    "load_failed",
    "load_succeeded",
    "load_wanted",
    "mark_down",
    "move_and_dispatch",
    "open_breaker",
    "orphaned_deployments",
    "passes_failing",
    "pass_reads",
    "policy_config",
    "probe_result",
    "recheck_deployment",
    "recount_in_flight",
    "register_worker",
    "release_worker",
    "request_failed",
    "requests_completed",
    "seen_used",
    "send_on_arrival",
    "server_for_adapter",
    "server_of_deployment",
    "server_failed",
    "server_name",
    "server_succeeded",
    "set_load_progress",
    "start_load",
    "start_unload",
    "stop_load",
    "take_over_stale_workers",
    "unload_called_off",
    "workers_beside_simulated",
    "write_reasons",
]
