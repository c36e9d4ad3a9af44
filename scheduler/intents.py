"""Operators' intents (load, unload, drain, enable), carried out by the worker's loop.

The API records an intent as a row (scheduler.api.servers). At the end of a pass the loop
reads the open ones, and `plan_intents` (pure, on the pass's snapshot) turns each into a
step: the same `StartLoad` or `Unload` decision the policy would make, executed through the
runtime's one place for each kind, or a server switched on or off. So the invariants hold
for intents too: one load or unload at a time per server (an intent waits for the one under
way), and no busy or pinned model is evicted (a load waits until its victims are idle).
An intent waits behind the earlier open intents of its server. Every change of an intent's
status, and every new reason it waits, is a trace row. A load intent's options stay on the
intent: the load it starts reads them (scheduler.store.loads), for that load only."""

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from backends.models import Server, available_again, unavailable_from

from . import channel_hints, wakeup
from .decisions import StartLoad, Unload
from .eviction import NoRoom, evictions_for
from .models import INTENT_ENDED, INTENT_OPEN, Intent, IntentTrace
from .pool_threads import in_pool_thread
from .snapshot import DeploymentView, Snapshot

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)
A, S = Intent.Action, Intent.Status
BUSY_STATES = ("loading", "unloading")


@dataclass(frozen=True, slots=True)
class IntentView:
    id: int
    action: str
    server_id: int
    deployment_id: int | None
    status: str
    force: bool
    reason: str  # the last trace's


@dataclass(frozen=True, slots=True)
class Step:
    intent_id: int
    status: str
    reason: str
    decision: StartLoad | Unload | None = None
    enable: bool | None = None  # switch the server on (True) or off (False)


def plan_intents(snapshot: Snapshot, intents: list[IntentView], now: datetime) -> list[Step]:
    """What to do for each open intent, oldest first; an intent with nothing new to say
    gets no step."""
    deployments = {d.id: d for d in snapshot.deployments}
    servers = {s.id: s for s in snapshot.servers}
    blocked: set[int] = set()  # servers with an earlier intent still open
    steps = []
    for intent in intents:
        if intent.server_id in blocked:
            step = Step(intent.id, S.PENDING, "waiting for the server's earlier intents")
        elif intent.action in (A.DRAIN, A.ENABLE):
            enable = intent.action == A.ENABLE
            done = "enabled" if enable else "drained: no new work; requests there finish"
            step = Step(intent.id, S.DONE, done, enable=enable)
        else:
            d = deployments.get(intent.deployment_id)
            if d is None:
                step = Step(intent.id, S.FAILED, "the deployment is gone")
            else:
                on_server = [x for x in snapshot.deployments if x.server_id == d.server_id]
                step = _model_step(intent, d, on_server, servers[d.server_id], now)
        if step.status in INTENT_OPEN:
            blocked.add(intent.server_id)
        if (step.status, step.reason) != (intent.status, intent.reason) or step.decision:
            steps.append(step)
    return steps


def _model_step(intent: IntentView, d: DeploymentView, on_server, server, now) -> Step:
    if intent.action == A.LOAD:
        if intent.status == S.RUNNING and d.state != "loading":
            if d.state == "loaded":
                return Step(intent.id, S.DONE, "loaded")
            return Step(intent.id, S.FAILED, f"the load failed: {d.last_error or d.state}")
        if d.state == "loaded":
            return Step(intent.id, S.DONE, "it was loaded already")
        if d.state == "loading":
            return Step(
                intent.id, S.RUNNING, intent.reason if intent.status == S.RUNNING else "loading"
            )
        if under_way := [x for x in on_server if x.state in BUSY_STATES]:
            busy = under_way[0]
            return Step(intent.id, S.PENDING, f"waiting: {busy.model} is {busy.state}")
        victims = evictions_for(d, server, on_server, now, may_evict=lambda _: True)
        if isinstance(victims, NoRoom):
            status = S.FAILED if victims.permanent else S.PENDING
            return Step(intent.id, status, f"no room: {victims.reason}")
        evicting = [x.model for x in on_server if x.id in victims]
        said = f", evicting {', '.join(evicting)}" if evicting else ""
        # Its log names the victims; an operator's load is never stopped for a request.
        load = StartLoad(d.id, victims, f"operator intent {intent.id}", "operator")
        return Step(intent.id, S.RUNNING, f"load started{said}", load)
    # unload
    if intent.status == S.RUNNING and d.state != "unloading":
        if d.state in ("unloaded", "failed"):
            return Step(intent.id, S.DONE, "unloaded")
        return Step(intent.id, S.FAILED, f"the unload failed: {d.last_error or d.state}")
    if d.state in ("unloaded", "failed"):
        return Step(intent.id, S.DONE, "it was not loaded any more")
    if d.state == "unloading":
        return Step(
            intent.id, S.RUNNING, intent.reason if intent.status == S.RUNNING else "unloading"
        )
    if d.state == "loading" or any(x.state in BUSY_STATES for x in on_server):
        return Step(intent.id, S.PENDING, "waiting for the load or unload under way")
    if d.in_flight:
        return Step(intent.id, S.PENDING, "waiting for its requests to finish")
    unload = Unload(d.id, f"operator intent {intent.id}")
    return Step(intent.id, S.RUNNING, "unload started", unload)


# -- the shell -------------------------------------------------------------------------


def open_intents() -> QuerySet[Intent]:
    """The intents not yet finished, oldest first, each with the reason of its latest step
    (`last_reason`), in one read: what the worker plans from and the dashboard shows."""
    latest = IntentTrace.objects.filter(intent=OuterRef("pk")).order_by("-at", "-id")
    return (
        Intent.objects.filter(status__in=INTENT_OPEN)
        .annotate(last_reason=Subquery(latest.values("reason")[:1]))
        .order_by("created_at", "id")
    )


def read_open() -> list[IntentView]:
    return [
        IntentView(
            i.pk, i.action, i.server_id, i.deployment_id, i.status, i.force, i.last_reason or ""
        )
        for i in open_intents()
    ]


def write_step(step: Step) -> None:
    with transaction.atomic():
        # Locked alone; its server's and model's names are for the log line below.
        intent = (
            Intent.objects.select_for_update(of=("self",))
            .select_related("server", "deployment__model")
            .get(pk=step.intent_id)
        )
        if intent.status in INTENT_ENDED:
            return  # another worker finished it
        if step.enable is not None:
            since = available_again("enabled") if step.enable else unavailable_from(timezone.now())
            Server.objects.filter(pk=intent.server_id).update(
                enabled=step.enable, unavailable_since=since
            )
        finished = step.status in INTENT_ENDED
        Intent.objects.filter(pk=intent.pk).update(
            status=step.status,
            finished_at=timezone.now() if finished else None,
            outcome=step.reason if finished else "",
        )
        IntentTrace.objects.create(intent=intent, status=step.status, reason=step.reason)
    channel_hints.dashboard_changed()  # its server's card shows the step
    on = f"{intent.deployment.model.name} on " if intent.deployment else ""
    what = f"{intent.action} {on}{intent.server.name}"
    by = intent.requested_by
    log.info("intent %s, %s (asked by %s): %s, %s", intent.pk, what, by, step.status, step.reason)


class Intents:
    """The loop's hook: `after_pass` carries out what is due. It reads the table only when
    there may be news: after a wake-up that was not an arrival (the API's, for a new
    intent), while intents are open, and every poll interval (the safety net)."""

    def __init__(self, runtime: "Runtime") -> None:
        self.runtime = runtime
        self.due = True
        self.open = False
        self.checked = -float("inf")

    def news(self, arrived: wakeup.Arrival | None) -> None:
        if arrived is None:
            self.due = True

    async def after_pass(self, snapshot: Snapshot) -> None:
        poll_s = settings.SWITCHYARD["POLL_INTERVAL_S"]
        if not (self.due or self.open or time.monotonic() - self.checked >= poll_s):
            return
        self.due, self.checked = False, time.monotonic()
        intents = await in_pool_thread(read_open)()
        self.open = bool(intents)
        for step in plan_intents(snapshot, intents, self.runtime.clock()):
            if step.decision is not None and not await self.runtime.execute(step.decision):
                continue  # the rows moved: the next pass sees them and plans again
            await in_pool_thread(write_step)(step)
            if step.enable is not None:
                # The pass just planned planned with the server as it was: plan again.
                self.runtime.wake.set()
