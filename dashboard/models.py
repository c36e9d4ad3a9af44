"""What the dashboard keeps of the past: per-minute figures by class, each model's stay on
each server, and the ETA each request was given. Written by the worker's history task
(`dashboard/history.py`), read by the charts; nothing on the request path writes here.

Requests are referred to by id, not by foreign key: finished requests are purged by plain
SQL (`scheduler/retention.py`), and the history outlives them until its own pruning."""

from django.db import models


class MinuteStat(models.Model):
    """One class's figures for one minute: how many finished in it, their waits (arrival to
    start, or to their end if they never started), and how many waited at the minute's end
    (None for minutes rolled up after the fact: nobody sampled the line then)."""

    minute = models.DateTimeField()
    priority = models.PositiveSmallIntegerField()
    finished = models.PositiveIntegerField(default=0)
    wait_p50_s = models.FloatField(null=True)
    wait_p95_s = models.FloatField(null=True)
    waiting = models.PositiveIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["minute", "priority"], name="one_stat_per_minute")
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} class {self.priority}: {self.finished} finished"


class RunStat(models.Model):
    """How long a model's requests of one class run, as a moving average over the minutes
    rolled up (each minute's mean weighs `history.RUN_WEIGHT`): what the ETA expects. And,
    where the servers counted the tokens they generated, their token line (`base_s` before
    the first token, `token_s` per token: `eta.token_line`) and `natural_tokens`, how long
    an answer runs when no cap cuts it (`history.natural_tokens`): a request is expected to
    generate that many, or the tokens it asks for at most if fewer."""

    model_id = models.BigIntegerField()
    priority = models.PositiveSmallIntegerField()
    run_s = models.FloatField()
    base_s = models.FloatField(null=True, blank=True)
    token_s = models.FloatField(null=True, blank=True)
    natural_tokens = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["model_id", "priority"], name="one_run_stat")
        ]

    def __str__(self) -> str:
        return f"model {self.model_id} class {self.priority}: {self.run_s:.1f} s"


class LoadSpan(models.Model):
    """One model's stay on a server: its load's start, when it was loaded, and when it left
    (unloaded, evicted or failed); `ended_at` is None while it is still there."""

    deployment_id = models.BigIntegerField()
    server = models.CharField(max_length=64)
    model = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    loaded_at = models.DateTimeField(null=True)
    ended_at = models.DateTimeField(null=True)
    failed = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment_id", "started_at"], name="one_span_per_load"
            )
        ]
        indexes = [models.Index(fields=["started_at"], name="spans_by_start")]

    def __str__(self) -> str:
        return f"{self.model} on {self.server} from {self.started_at:%H:%M:%S}"


class EtaCheck(models.Model):
    """The ETA (seconds until the request is sent to a server) it was first given, the last
    one it was given as its place in line changed, and, once it started, how far off the
    first one was: `error_s` > 0 means it started later than said."""

    request_id = models.UUIDField(primary_key=True)
    priority = models.PositiveSmallIntegerField()
    given_at = models.DateTimeField()
    given_s = models.FloatField()
    position = models.PositiveIntegerField()
    last_at = models.DateTimeField()
    last_s = models.FloatField()
    last_position = models.PositiveIntegerField()
    started_at = models.DateTimeField(null=True)
    error_s = models.FloatField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["started_at"], name="eta_checks_by_start"),
            models.Index(fields=["given_at"], name="eta_checks_by_given"),
        ]

    def __str__(self) -> str:
        return f"ETA {self.given_s:.1f} s for {self.request_id}"
