"""The OpenAI Batch API's files and batches: a batch is a file of requests, each stored as
a background request of its own and scheduled like any other (docs/api.md, "Batches")."""

import secrets

from django.db import models
from django.utils import timezone


def file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


class File(models.Model):
    """A file a caller uploaded (`batch`: a batch's input) or a batch wrote
    (`batch_output`: its answers and its errors)."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(primary_key=True, max_length=40, default=file_id, editable=False)
    # Who owns it (None with SWITCHYARD_AUTH=off): only that key sees it.
    api_key = models.ForeignKey(
        "access.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    content = models.TextField(blank=True)
    bytes = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.filename} ({self.id})"


class Batch(models.Model):
    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=40, default=batch_id, editable=False)
    api_key = models.ForeignKey(
        "access.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    endpoint = models.CharField(max_length=40)
    # Ids, not keys: a batch keeps naming its files after they are deleted, as OpenAI's do.
    input_file_id = models.CharField(max_length=40)
    output_file_id = models.CharField(max_length=40, blank=True)
    error_file_id = models.CharField(max_length=40, blank=True)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    total = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    cancelling_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its last request ended (completed, expired or cancelled).",
    )

    class Meta:
        verbose_name_plural = "batches"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.id


class BatchItem(models.Model):
    """One line of a batch's input: the request it became."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items")
    line = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    # No constraint in the database: retention deletes finished requests with plain SQL,
    # and knows nothing of batches. A purged request reads as none (`end` says so).
    request = models.OneToOneField(
        "scheduler.Request",
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="batch_item",
    )

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="one_custom_id_a_batch")
        ]

    def __str__(self) -> str:
        return f"{self.batch_id} line {self.line} ({self.custom_id})"
