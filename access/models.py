"""API keys: who calls, and what each caller may do."""

import hashlib
import secrets

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from scheduler.models import Priority

KEY_MARK = "sy-"  # every key starts with it: easy to spot in a config file or a leak scan
WEBHOOK_MARK = "whsec-"  # and a key's webhook secret with this


def new_webhook_secret() -> str:
    return f"{WEBHOOK_MARK}{secrets.token_urlsafe(32)}"


def masked(secret: str) -> str:
    """How a stored secret is shown back: its last 4 characters."""
    return f"…{secret[-4:]}" if secret else ""


def hash_key(key: str) -> str:
    """A fast hash is enough: a key has 256 random bits, nothing to guess from."""
    return hashlib.sha256(key.encode()).hexdigest()


def split_key(key: str) -> tuple[str, str] | None:
    """(prefix, key) of a well-formed key, else None."""
    if not key.startswith(KEY_MARK):
        return None
    prefix, dot, secret = key[len(KEY_MARK) :].partition(".")
    if not dot or len(prefix) != 8 or not secret:
        return None
    return prefix, key


# How a streamed chat shows its wait (docs/api.md). config/settings.py checks
# SWITCHYARD_STREAM_PROGRESS against the same two words (it loads before the apps).
STREAM_PROGRESS = ("comments", "reasoning")


class Team(models.Model):
    """Keys that share one allotment of the GPUs: a weight against other teams, slots at
    once and daily quotas, all counted over every key of the team."""

    name = models.CharField(max_length=100, unique=True)
    weight = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text="Its share of the slots against other teams (and keys in no team) with work"
        " waiting in a class; its keys share it by their own weights.",
    )
    max_processing = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most requests of all its keys processing at once; more wait their turn."
        " Empty: no limit.",
    )
    daily_processing_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Processing seconds (GPU time) all its keys may use a day (UTC); beyond, new"
        " requests are refused until midnight UTC. Empty: no limit.",
    )
    daily_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Prompt and completion tokens all its keys may use a day (UTC); beyond, new"
        " requests are refused until midnight UTC. Empty: no limit.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def has_daily_quota(self) -> bool:
        return self.daily_processing_s is not None or self.daily_tokens is not None


class ApiKey(models.Model):
    name = models.CharField(max_length=100, help_text="Who or what uses it.")
    team = models.ForeignKey(
        Team,
        null=True,
        blank=True,
        on_delete=models.PROTECT,  # deleting a team must not quietly lift its keys' limits
        related_name="keys",
        help_text="The team whose share and quotas it uses as well as its own; empty: none.",
    )
    prefix = models.CharField(
        max_length=16, unique=True, editable=False, help_text="The key's public part."
    )
    hashed_key = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Refused from then on; empty: never."
    )
    revoked = models.BooleanField(default=False, help_text="Refused from now on (within 5 s).")
    operator = models.BooleanField(
        default=False, help_text="May use the operator API (see docs/operating.md)."
    )
    max_priority = models.PositiveSmallIntegerField(
        choices=Priority.choices,
        default=Priority.INTERACTIVE,
        help_text="The highest class it may use; a request above it runs at this class.",
    )
    default_priority = models.PositiveSmallIntegerField(
        choices=Priority.choices,
        default=Priority.NORMAL,
        help_text="The class of a request that names none.",
    )
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="Model names it may use; empty: all of them."
    )
    rpm = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute; empty: no limit."
    )
    max_waiting = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most requests waiting at once; empty: no limit."
    )
    max_processing = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most requests processing at once; more wait their turn. Empty: no limit.",
    )
    daily_processing_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Processing seconds (GPU time) its requests may use a day (UTC); beyond,"
        " new requests are refused until midnight UTC. Empty: no limit.",
    )
    daily_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Prompt and completion tokens its requests may use a day (UTC); beyond, new"
        " requests are refused until midnight UTC. Empty: no limit.",
    )
    weight = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1)],
        help_text="Its share of the slots against other keys with work waiting in a class.",
    )
    stream_progress = models.CharField(
        max_length=10,
        blank=True,
        choices=[(word, word) for word in STREAM_PROGRESS],
        help_text="How its streamed chats show their wait: reasoning (reasoning_content chunks,"
        " which chat apps show as thinking) or comments (SSE comments only); empty:"
        " SWITCHYARD_STREAM_PROGRESS. A caller's X-Switchyard-Progress wins.",
    )
    # Kept as it is (the worker signs with it), shown once, never shown back in full.
    webhook_secret = models.CharField(
        max_length=100,
        blank=True,
        editable=False,
        help_text="Signs the callbacks of its jobs; empty: SWITCHYARD_WEBHOOK_SECRET does.",
    )

    class Meta:
        verbose_name = "API key"
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({KEY_MARK}{self.prefix}…)"

    @classmethod
    def generate(cls, name: str, **fields) -> tuple["ApiKey", str]:
        """A new unsaved key and its secret, to be shown once (its `webhook_secret` too)."""
        while True:
            prefix = secrets.token_hex(4)
            if not cls.objects.filter(prefix=prefix).exists():
                break
        key = f"{KEY_MARK}{prefix}.{secrets.token_urlsafe(32)}"
        fields.setdefault("webhook_secret", new_webhook_secret())
        return cls(name=name, prefix=prefix, hashed_key=hash_key(key), **fields), key

    def rotate_webhook_secret(self) -> str:
        """A new webhook secret, saved; the old one signs nothing from now on."""
        self.webhook_secret = new_webhook_secret()
        ApiKey.objects.filter(pk=self.pk).update(webhook_secret=self.webhook_secret)
        return self.webhook_secret

    def is_usable(self, now=None) -> bool:
        return not self.revoked and (
            self.expires_at is None or self.expires_at > (now or timezone.now())
        )

    def has_daily_quota(self) -> bool:
        return self.daily_processing_s is not None or self.daily_tokens is not None

    def has_processing_quota(self) -> bool:
        """Its requests may have to wait for one of its own (or its team's) to end."""
        return self.max_processing is not None or (
            self.team is not None and self.team.max_processing is not None
        )

    def allows_model(self, name: str) -> bool:
        return not self.allowed_models or name in self.allowed_models


class KeyUsage(models.Model):
    """What a key used in a day (UTC): counted as its requests finish."""

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage")
    day = models.DateField()
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    processing_s = models.FloatField(default=0.0)

    class Meta:
        verbose_name_plural = "key usage"
        ordering = ["-day", "api_key"]
        constraints = [
            models.UniqueConstraint(fields=["api_key", "day"], name="one_usage_row_a_day")
        ]

    def __str__(self) -> str:
        return f"{self.api_key.name} on {self.day}"
