"""The end of a request on its server: completed (with the sends its slot allows), failed, or
cancelled."""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.utils import timezone

from backends.adapters.base import AdapterError, ErrorCode
from backends.models import Deployment, DeploymentState

from .. import sql, wakeup
from ..durations import spoken
from ..models import WAITING_STATES, Request, RequestKind, State
from ..retry import backoff_s
from ..transitions import Transition, end_later, locking, move, move_all
from .dispatch import Sending, ServeJob, dispatch_all
from .health import server_failed
from .knobs import knob
from .queries import DEPLOYMENTS, lock_deployments, lock_servers, servers_deployments

DS = DeploymentState


def _release(
    deployment_id: int, seconds: float | None = None, only_if: sql.Statement | None = None
) -> None:
    """Free the slot of a request that finished on the deployment; `seconds`, its inference
    time if it completed, goes into the moving average. `only_if`: an SQL condition the
    write waits on (a request's end sent in the same round trip)."""
    changes = "in_flight = CASE WHEN in_flight > 0 THEN in_flight - 1 ELSE 0 END, last_used_at = %s"
    params: list[Any] = [sql.db_value(Deployment, "last_used_at", timezone.now())]
    if seconds is not None:
        # With no average yet (NULL propagates), COALESCE takes this measurement alone.
        changes += ", avg_inference_s = COALESCE(0.8 * avg_inference_s + %s, %s)"
        params += [0.2 * seconds, seconds]
    statement = f"UPDATE {DEPLOYMENTS} SET {changes} WHERE id = %s"
    params.append(deployment_id)
    if only_if is not None:
        statement += f" AND {only_if[0]}"
        params += only_if[1]
    sql.write_later(sql.prepared(statement), params)


def run_s(answer: "Answer") -> float | None:
    """The inference time an answer adds to its deployment's moving average: none for a
    token count, which takes milliseconds and would pull the run time the ETAs and the
    parallel loads price a generation at far below one."""
    return None if answer.job.call.kind == RequestKind.COUNT_TOKENS else answer.seconds


class PlannedSend(NamedTuple):
    """The request a pass planned for a slot as it frees (its `SendNext`), as the answer
    that frees the slot carries it to its write."""

    request_id: Any
    deployment_id: int
    effective_priority: int  # its class after aging, as planned
    api_key: int  # 0 for none
    plan: int  # the number of the pass whose plan it is (`runtime.fast_paths.PassArrivals`)


@dataclass(frozen=True)
class Answer:
    job: ServeJob
    result: dict
    seconds: float
    then_send: PlannedSend | None = None  # the request planned for the slot this answer frees


def requests_completed(
    answers: list[Answer], send_now: Sending | None = None, notify_origin: bool = True
) -> list[bool]:
    """Store the results, in one transaction (on PostgreSQL, one round trip), and send the
    requests planned for the slots they free, given to `send_now` as `dispatch_all` does
    (two more round trips: the sends read the freed slots). False for a request taken from
    this worker meanwhile; its slot is not ours to fill. `notify_origin`: see `end_later`
    (a fast path: `runtime/fast_paths.py`).

    With `SWITCHYARD_SKIP_FLUSH` on, the commit does not wait for the disk (a flush was
    about a millisecond of every answer's wait here): should a crash of the database lose
    it, the request is back in `processing` under a worker whose connection died with the
    database. That worker exits (`run_scheduler`), and whoever takes its work over runs the
    request again."""
    sends = [a.then_send for a in answers if a.then_send is not None]
    with sql.atomic():
        sql.without_waiting_for_disk()
        # The lock order (servers, deployments, then requests): with sends, the servers
        # first, as every dispatch locks them; the deployments whose slots free before the
        # requests. Held writes, gone in the same round trip as the ends.
        freed = sorted({a.job.deployment_id for a in answers})
        if sends:
            # And every deployment of their servers, as the dispatch below locks them.
            deployments = sorted({send.deployment_id for send in sends} | set(freed))
            sql.write_later(*lock_servers(deployments))
            sql.write_later(*servers_deployments(deployments))
        else:
            sql.write_later(*lock_deployments(freed))
        if sends or len(answers) > 1:
            # The requests that end and those sent after, together in id order: an end's
            # write locks its row, and a lock taken out of order meets another worker's.
            ids = [a.job.request_id for a in answers] + [send.request_id for send in sends]
            sql.write_later(*locking("id", sql.keys(Request, dict.fromkeys(ids))))
        ends = []
        for a in answers:
            end = end_later(
                Transition(
                    a.job.request_id,
                    (State.PROCESSING,),
                    State.COMPLETED,
                    f"completed in {spoken(a.seconds)}",
                    {"result": a.result},
                    at_server=a.job.server_name,
                    held_by=a.job.worker_id,
                ),
                notify_origin=notify_origin and not a.job.call.stream,
            )
            _release(a.job.deployment_id, run_s(a), only_if=end.condition)
            ends.append(end)
        if sends:
            sql.send_held_writes()
            # An end made was held by its job's worker id, which is then this worker's own.
            made = [
                (a.job.worker_id, a.then_send)
                for a, end in zip(answers, ends, strict=True)
                if end.made and a.then_send is not None
            ]
            if made:
                dispatch_all(
                    [(send.request_id, send.deployment_id) for _, send in made],
                    made[0][0],
                    send_now=send_now,
                    reason="sent to the server as a slot freed there",
                )
    return [end.made for end in ends]


def request_failed(job: ServeJob, error: AdapterError, may_retry: bool = True) -> str:
    """Retry with backoff, re-route if the model went away, or fail. Returns the new state.

    `may_retry` is False once part of a streamed answer reached the caller: running it again
    would send the caller a second beginning."""
    attempts = Request.objects.values_list("attempts", flat=True).get(pk=job.request_id)
    attempts_left = may_retry and attempts < knob("REQUEST_ATTEMPTS")
    with transaction.atomic():
        sql.fetch(*lock_deployments([job.deployment_id]))  # before the request: the lock order
        if error.code == ErrorCode.NOT_LOADED and attempts_left:
            Deployment.objects.filter(pk=job.deployment_id, state=DS.LOADED).update(
                state=DS.UNLOADED,
                state_changed_at=timezone.now(),
                loaded_at=None,
                load_progress=None,
            )
            state = State.PENDING
            reason = f"the server no longer has the model loaded ({error.message}); routing again"
            fields: dict[str, Any] = {"deployment": None, "server": None, "worker": None}
        elif error.retryable and attempts_left:
            delay = error.retry_after_s or backoff_s(
                attempts, knob("RETRY_BASE_S"), knob("RETRY_MAX_S")
            )
            state = State.READY
            reason = f"{error.code}: {error.message}; retry {attempts + 1} in {delay:.2f} s"
            fields = {"not_before": timezone.now() + timedelta(seconds=delay), "worker": None}
        else:
            state = State.FAILED
            reason = f"{error.code}: {error.message}"
            if error.retryable and not may_retry:
                reason += " (the stream had begun: not retried)"
            elif error.retryable:
                reason += f" (after {attempts} attempts)"
            fields = {"error": error.message[:4000], "error_code": error.code}
        moved = move(
            job.request_id,
            [State.PROCESSING],
            state,
            reason,
            job.server_name,
            held_by=job.worker_id,
            **fields,
        )
        if moved:
            _release(job.deployment_id)
    # A request's own retries count once toward its server's breaker, unless it could not
    # reach the server: an answer the server gives one request alone (a poison input) must
    # not put the server in cooldown for every model on it.
    if error.server_fault and (attempts <= 1 or error.code == ErrorCode.CONNECTION):
        server_failed(job.server_id, error.message)
    return state if moved else "taken over"


def cancelled_because(reason: str) -> dict[str, str]:
    """A cancelled request's error: who cancelled it, for its caller, the jobs API, the
    pages and a batch's error file (as a failed one says why it failed)."""
    return {"error": reason[:2000], "error_code": "cancelled"}


def cancel_request(request_id, reason: str) -> bool:
    """Cancel a request that has not ended; False if it had. A waiting one ends at once. One
    at its server ends with its slot freed in the same transaction, and the worker serving
    it is told (`wakeup.Cancelled`) to stop its call: closing the connection stops the
    server's generation. Should that worker not hear (it died, or runs in another process
    on the embedded default, which has no NOTIFY), its answer finds the request ended and is
    dropped; the slot was freed here either way."""
    said = cancelled_because(reason)
    if move(request_id, WAITING_STATES, State.CANCELLED, reason, **said):
        return True
    at = Request.objects.filter(pk=request_id, state=State.PROCESSING)
    found = at.values_list("deployment_id", "server__name").first()
    if found is None:
        return False
    deployment_id, server = found  # no deployment: its model was deleted meanwhile
    with transaction.atomic():
        if deployment_id is not None:  # before the request: the lock order
            sql.fetch(*lock_deployments([deployment_id]))
        # Still on that deployment (not retried elsewhere meanwhile), under lock.
        if not at.filter(deployment_id=deployment_id).select_for_update(no_key=True).exists():
            return False
        if not move(request_id, [State.PROCESSING], State.CANCELLED, reason, server or "", **said):
            return False
        if deployment_id is not None:
            _release(deployment_id)
        cancelled = wakeup.Cancelled(request_id)
        wakeup.notify_later(wakeup.CHANNEL, cancelled.payload())
        transaction.on_commit(lambda: wakeup.wake_local(cancelled))
    return True


CANCELS_PER_TRANSACTION = 500


def cancel_requests(ids: list, reason: str, processing: bool = True) -> int:
    """Cancel those of `ids` that have not ended, as `cancel_request` does, and say how many.
    The waiting ones go many to a transaction; with `processing`, each one at its server is
    then stopped there, else it is left alone."""
    cancelled = 0
    for chunk in sql.chunks(ids, CANCELS_PER_TRANSACTION):
        said = cancelled_because(reason)
        moved = move_all(
            [Transition(pk, WAITING_STATES, State.CANCELLED, reason, said) for pk in chunk]
        )
        cancelled += sum(moved)
        if processing:
            left = (pk for pk, done in zip(chunk, moved, strict=True) if not done)
            cancelled += sum(cancel_request(pk, reason) for pk in left)
    return cancelled
