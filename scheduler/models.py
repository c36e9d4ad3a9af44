"""Requests, their traces, and the workers that hold them."""

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class RequestKind(models.TextChoices):
    CHAT = "chat", "Chat completion"
    COMPLETION = "completion", "Completion"
    EMBEDDING = "embedding", "Embedding"
    RERANK = "rerank", "Rerank"
    RESPONSE = "response", "Response"  # OpenAI's Responses API
    MESSAGE = "message", "Message"  # Anthropic's Messages API
    COUNT_TOKENS = "count_tokens", "Token count"  # Anthropic's count of a message's tokens


class Priority(models.IntegerChoices):
    """Lower wins."""

    INTERACTIVE = 0, "interactive"
    HIGH = 1, "high"
    NORMAL = 2, "normal"
    BACKGROUND = 3, "background"


class State(models.TextChoices):
    PENDING = "pending", "Pending"
    NEEDS_LOADING = "needs_loading", "Needs loading"
    READY = "ready", "Ready"
    PROCESSING = "processing", "Processing"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    EXPIRED = "expired", "Expired"


WAITING_STATES = (State.PENDING, State.NEEDS_LOADING, State.READY)
TERMINAL_STATES = (State.COMPLETED, State.FAILED, State.CANCELLED, State.EXPIRED)


class WorkerQuerySet(models.QuerySet):
    def live(self, now: datetime | None = None) -> "WorkerQuerySet":
        return self.filter(last_heartbeat__gte=Worker.live_since(now))


class Worker(models.Model):
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    # The kernel's boot and the PID namespace the worker ran in: a worker that shares them
    # can tell at once that this one's process has exited (scheduler/store/workers.py).
    machine = models.CharField(max_length=120, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)
    # Its passes fail since then (it goes on serving what it runs: runtime/failing_passes).
    failing_since = models.DateTimeField(null=True, blank=True)
    failing_error = models.TextField(blank=True, default="")

    objects = WorkerQuerySet.as_manager()

    def __str__(self) -> str:
        return f"worker {self.pk} ({self.host}:{self.pid})"

    @staticmethod
    def live_since(now: datetime | None = None) -> datetime:
        """A worker is live while its heartbeat is fresher than `SWITCHYARD_WORKER_STALE_S`:
        what the dashboard, /readyz, the metrics and the admin count (the runtime's take-over
        reads its own knob)."""
        stale_s = settings.SWITCHYARD["WORKER_STALE_S"]
        return (now or timezone.now()) - timedelta(seconds=stale_s)

    def is_live(self, now: datetime | None = None) -> bool:
        return self.last_heartbeat >= self.live_since(now)


class Request(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=16, choices=RequestKind.choices)
    model_name = models.CharField(max_length=200, help_text="The name the app asked for.")
    model = models.ForeignKey(
        "backends.Model", null=True, on_delete=models.SET_NULL, related_name="requests"
    )
    payload = models.JSONField()
    stream = models.BooleanField(default=False)
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    server = models.ForeignKey(
        "backends.Server", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    deployment = models.ForeignKey(
        "backends.Deployment",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requests",
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    routed_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(help_text="Expired if still waiting then.")
    not_before = models.DateTimeField(
        null=True, blank=True, help_text="Retry backoff: not dispatched before this."
    )
    attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_code = models.CharField(max_length=32, blank=True)
    worker = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="requests"
    )
    # Who sent it (None with SWITCHYARD_AUTH=off): only that key sees it. Indexed with
    # created_at below, for the key's requests per minute.
    api_key = models.ForeignKey(
        "access.ApiKey",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requests",
        db_index=False,
    )
    callback_url = models.CharField(
        max_length=2000, blank=True, help_text="POSTed the final state when it ends."
    )
    no_server_grace_s = models.FloatField(
        null=True,
        blank=True,
        help_text="How long it waits while no server can serve its model (empty: the"
        " setting SWITCHYARD_NO_SERVER_GRACE_S); a job may ask for longer.",
    )
    # A line of a batch (the batches app): one call made it, so it counts against no queue
    # bound and no key's pace (docs/api.md, "Batches").
    in_batch = models.BooleanField(default=False, help_text="Stored as a line of a batch.")
    # The conversation it continues (docs/api.md, "Prompt-cache affinity"): a hash of the
    # caller's `prompt_cache_key`, else of its model and first turn. Indexed below.
    affinity_key = models.CharField(
        "conversation", max_length=32, blank=True, default="", help_text="Its conversation, hashed."
    )
    cache_server = models.ForeignKey(
        "backends.Server",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
        verbose_name="last turn's server",
        help_text="Where its conversation's last turn ran: preferred while it has a free slot.",
    )
    # Why it waits, as the last pass that changed it said: {"kind", "text", "details"}
    # (scheduler/reasons.py). Written only when it changes (scheduler/store/reasons.py).
    reason = models.JSONField(null=True, blank=True, help_text="Why it waits (the policy's).")

    class Meta:
        ordering = ["priority", "created_at", "id"]
        indexes = [
            models.Index(
                fields=["priority", "created_at", "id"],
                name="waiting_requests",
                condition=models.Q(state__in=["pending", "needs_loading", "ready"]),
            ),
            # The oldest waiting first: where aging and expiry happen (see store.SnapshotReader).
            models.Index(
                fields=["created_at", "id"],
                name="waiting_by_age",
                condition=models.Q(state__in=["pending", "needs_loading", "ready"]),
            ),
            # Each model's own line: a model that can be served is seen behind a deep line.
            models.Index(
                fields=["model", "priority", "created_at", "id"],
                name="waiting_by_model",
                condition=models.Q(state__in=["pending", "needs_loading", "ready"]),
            ),
            # The last finished first, as the dashboard lists them: read by this index, the
            # list costs the same at any size of the table (it sorted every finished row).
            models.Index(
                fields=["-finished_at", "-created_at"],
                name="finished_requests",
                condition=models.Q(state__in=["completed", "failed", "cancelled", "expired"]),
            ),
            models.Index(fields=["state"], name="request_state"),
            models.Index(fields=["api_key", "created_at"], name="requests_by_key"),
            # Each key's own line: a key's requests are seen behind a deep line of another's
            # (fair share; see store.SnapshotReader).
            models.Index(
                fields=["api_key", "priority", "created_at", "id"],
                name="waiting_by_key",
                condition=models.Q(state__in=["pending", "needs_loading", "ready"]),
            ),
            # A conversation's last turn, found as its next one arrives.
            models.Index(
                fields=["affinity_key", "created_at"],
                name="requests_by_affinity",
                condition=~models.Q(affinity_key=""),
            ),
            # What each key has processing, read on every pass: no more entries than slots.
            models.Index(
                fields=["api_key"], name="processing_by_key", condition=models.Q(state="processing")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.model_name} ({self.state})"

    @property
    def priority_name(self) -> str:
        return Priority(self.priority).label

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def waited_s(self, now: datetime) -> float:
        """Seconds in line: until it was sent, or until `now` while it waits (a retry waits
        again). Never below 0: its times may come from two hosts' clocks."""
        waiting = self.state in WAITING_STATES
        end = now if waiting else self.started_at or self.finished_at or now
        return max((end - self.created_at).total_seconds(), 0.0)


class Trace(models.Model):
    request = models.ForeignKey(Request, on_delete=models.CASCADE, related_name="traces")
    at = models.DateTimeField(default=timezone.now)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    server = models.CharField(max_length=64, blank=True)
    reason = models.TextField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '·'} → {self.to_state}: {self.reason}"


class MetricEvent(models.Model):
    """A load, a failed or stopped load, a restore, an eviction or a breaker trip, written by
    the worker as it happens, for /metrics to count at scrape time (see
    scheduler.metric_totals)."""

    class Kind(models.TextChoices):
        LOAD = "load", "Load"
        LOAD_FAILED = "load_failed", "Failed load"
        LOAD_STOPPED = "load_stopped", "Stopped load"
        RESTORE = "restore", "Restore on idle"
        EVICTION = "eviction", "Eviction"
        BREAKER_TRIP = "breaker_trip", "Breaker trip"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    server = models.CharField(max_length=64)
    model = models.CharField(max_length=200, blank=True)
    seconds = models.FloatField(null=True, blank=True, help_text="A load's duration.")
    at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.model}@{self.server}"

    @classmethod
    def record(cls, kind: str, server: str, model: str = "", seconds: float | None = None):
        cls.objects.create(kind=kind, server=server, model=model, seconds=seconds)


class MetricCarry(models.Model):
    """What purged rows had added to a counter or histogram: kept so that no counter of
    /metrics goes down when retention deletes the rows it was counted from."""

    metric = models.CharField(max_length=64)
    key = models.CharField(max_length=400, help_text="The labels, as text, for uniqueness.")
    labels = models.JSONField(default=list)
    count = models.BigIntegerField(default=0)
    total = models.FloatField(default=0.0)
    buckets = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["metric", "key"], name="one_carry")]

    def __str__(self) -> str:
        return f"{self.metric}{{{self.key}}}"


class Intent(models.Model):
    """An operator's wish for a server (load, unload, drain, enable), recorded by the API and
    carried out by a worker's loop like its own decisions, so the invariants hold for it
    too: one load at a time per server, and no busy model evicted."""

    class Action(models.TextChoices):
        LOAD = "load", "Load a model"
        UNLOAD = "unload", "Unload a model"
        DRAIN = "drain", "Drain (take no new work)"
        ENABLE = "enable", "Enable"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    server = models.ForeignKey("backends.Server", on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=8, choices=Action.choices)
    deployment = models.ForeignKey(
        "backends.Deployment", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    options = models.JSONField(default=dict, blank=True, help_text="A load's options.")
    force = models.BooleanField(default=True, help_text="Unload: wait for a busy model.")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    requested_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["created_at", "id"],
                name="open_intents",
                condition=models.Q(status__in=["pending", "running"]),
            )
        ]

    def __str__(self) -> str:
        what = f" {self.deployment}" if self.deployment_id else ""
        return f"{self.action}{what} on {self.server} ({self.status})"


INTENT_OPEN = (Intent.Status.PENDING, Intent.Status.RUNNING)
INTENT_ENDED = (Intent.Status.DONE, Intent.Status.FAILED)


class IntentTrace(models.Model):
    """The append-only story of an intent: each change of its status, and why."""

    intent = models.ForeignKey(Intent, on_delete=models.CASCADE, related_name="traces")
    at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=8)
    reason = models.TextField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


class Callback(models.Model):
    """The delivery of a job's final state to its `callback_url` (see scheduler.webhooks):
    stored with the request, sent by a worker once the request ends, retried with backoff."""

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting for the request to end"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    request = models.OneToOneField(
        Request, primary_key=True, on_delete=models.CASCADE, related_name="callback"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.WAITING)
    attempts = models.PositiveIntegerField(default=0)
    next_at = models.DateTimeField(
        null=True, blank=True, help_text="Not tried before this (a backoff, or a claim)."
    )
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_at"], name="callbacks_waiting", condition=models.Q(status="waiting")
            )
        ]

    def __str__(self) -> str:
        return f"callback of {self.request_id} ({self.status})"


class IdempotencyKey(models.Model):
    """A caller's Idempotency-Key and the request it stored: a retry with the same key gets
    that request back instead of storing (and running) another. Kept 24 h. Written in the
    transaction that stores the request, so a key never names a request that is not."""

    scope = models.CharField(max_length=32, help_text="The API key's id; empty with auth off.")
    key = models.CharField(max_length=255)
    request_id = models.UUIDField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="one_request_per_idempotency_key")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_keys_by_age")]

    def __str__(self) -> str:
        return f"{self.key} → {self.request_id}"
