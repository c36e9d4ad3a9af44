"""Servers, the models apps ask for, and where each model can run (deployments)."""

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import keep_loaded
from .adapters.base import CAPABILITIES


def validate_keep_loaded_hours(text: str) -> None:
    try:
        keep_loaded.parse(text)
    except ValueError as error:
        raise ValidationError(str(error)) from error


def validate_capabilities(value) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(c in CAPABILITIES for c in value):
        raise ValidationError(
            f"{value!r}: expected a list of {', '.join(CAPABILITIES)} (or empty: none of them)"
        )
    if len(set(value)) != len(value):
        raise ValidationError(f"{value!r} names a capability twice")


def validate_base_url(url: str) -> None:
    """http(s), a host and a valid port. Unlike Django's URLValidator this accepts bare host
    names (`http://gpu-1:1234`), which is how inference servers on a LAN are usually reached."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValidationError(f"{url!r} has an invalid port.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise ValidationError(f"{url!r} is not an http(s) URL with a host, e.g. http://gpu-1:1234")
    if port == 0:
        raise ValidationError(f"{url!r} has an invalid port.")


class ServerKind(models.TextChoices):
    SIMULATED = "simulated", "Simulated (demo, in-process)"
    OPENAI = "openai", "OpenAI-compatible (no load control)"
    LMSTUDIO = "lmstudio", "LM Studio"
    OLLAMA = "ollama", "Ollama"
    LLAMACPP = "llamacpp", "llama.cpp llama-server"
    LLAMASWAP = "llamaswap", "llama-swap"
    VLLM = "vllm", "vLLM"
    LEMONADE = "lemonade", "Lemonade"


class Health(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    UP = "up", "Up"
    DOWN = "down", "Down"
    COOLDOWN = "cooldown", "Cooldown"


class ModelType(models.TextChoices):
    LLM = "llm", "LLM"
    EMBEDDING = "embedding", "Embedding"
    RERANKING = "reranking", "Reranking"


class Device(models.TextChoices):
    CPU = "cpu", "CPU"
    GPU = "gpu", "GPU"
    NPU = "npu", "NPU"


class DeploymentState(models.TextChoices):
    UNLOADED = "unloaded", "Unloaded"
    LOADING = "loading", "Loading"
    LOADED = "loaded", "Loaded"
    UNLOADING = "unloading", "Unloading"
    FAILED = "failed", "Failed"


class LoadCause(models.TextChoices):
    """Who asked for a deployment's last load (the policy treats a restore as a guess)."""

    REQUEST = "request", "requests waiting"
    RESTORE = "restore", "restore on idle"
    PRELOAD = "preload", "preload"
    OPERATOR = "operator", "an operator's load"
    OUTSIDE = "outside", "loaded outside Switchyard"


def unavailable_from(now) -> models.Expression:
    """For `update(unavailable_since=…)` as a server goes out of service: `now`, unless it
    already was out of service (then since then)."""
    return Coalesce(F("unavailable_since"), Value(now, output_field=models.DateTimeField()))


def available_again(by: str) -> models.Expression:
    """For `update(unavailable_since=…)` as a server comes back in one respect (`by`:
    "health", back up; or "enabled"): None, unless it is still out in the other."""
    still_out = Q(enabled=False) if by == "health" else Q(health__in=("down", "cooldown"))
    return Case(When(still_out, then=F("unavailable_since")), default=Value(None))


class Server(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=ServerKind.choices, default=ServerKind.OPENAI)
    base_url = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_base_url],
        help_text="Root URL, e.g. http://gpu-1:1234",
    )
    api_key = models.CharField(max_length=256, blank=True, help_text="Sent as a Bearer token.")
    enabled = models.BooleanField(default=True)
    slots = models.PositiveIntegerField(default=1, help_text="Requests it serves at once.")
    max_llm = models.PositiveIntegerField("max LLMs", default=1)
    max_embedding = models.PositiveIntegerField("max embedding models", default=1)
    max_reranking = models.PositiveIntegerField("max reranking models", default=1)
    max_models = models.PositiveIntegerField(
        "max models in all",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Models of every type together it holds at once, besides each type's own"
        " limit; empty: no such limit. Filled in where the server says (a llama-server"
        " router's --models-max).",
    )
    memory_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Optional memory budget for loaded models (MB)."
    )
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    last_seen = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    cooldown_until = models.DateTimeField(null=True, blank=True)
    unavailable_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Since when it is down, disabled or in cooldown (the no-server grace of the"
        " requests that wait for it counts from then).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_simulated(self) -> bool:
        return self.kind == ServerKind.SIMULATED

    @property
    def room(self) -> dict[str, int]:
        """How many models of each type it may hold at once."""
        return {
            "llm": self.max_llm,
            "embedding": self.max_embedding,
            "reranking": self.max_reranking,
        }


class Model(models.Model):
    name = models.CharField(max_length=200, unique=True, help_text="The name apps ask for.")
    aliases = models.JSONField(default=list, blank=True, help_text='e.g. ["qwen", "qwen3"]')
    type = models.CharField(max_length=16, choices=ModelType.choices, default=ModelType.LLM)
    load_timeout_s = models.PositiveIntegerField(default=150)
    load_options = models.JSONField(
        default=dict, blank=True, help_text="Defaults for every deployment, e.g. context size."
    )
    capabilities = models.JSONField(
        null=True,
        blank=True,
        default=None,
        validators=[validate_capabilities],
        help_text='What it takes besides text, e.g. ["tools", "vision", "thinking"]; [] for none'
        " of them; empty: unknown (discovery fills it where a server says).",
    )
    context_length = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens of context a request may use on any of its servers; empty: unknown"
        " (discovery fills it where a server says the context it runs the model with).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def names(self) -> list[str]:
        """Every name apps may ask for it by: its own, then its aliases."""
        return [self.name, *(self.aliases or [])]


class Deployment(models.Model):
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="deployments")
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="deployments")
    server_model_id = models.CharField(max_length=300, help_text="The name the server knows.")
    size_mb = models.PositiveIntegerField(null=True, blank=True)
    device = models.CharField(max_length=8, choices=Device.choices, default=Device.GPU)
    load_options = models.JSONField(
        default=dict,
        blank=True,
        help_text="Merged over the model's. Simulated servers read load_seconds, "
        "tokens_per_second and fail_load here.",
    )
    load_overrides = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="The options an operator's load intent asked for, over the load options,"
        " for the load under way or in place only; the next load replaces them.",
    )
    slots = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests of this model it serves at once (the server's own setting for the"
        " model, such as llama-server's --parallel or Ollama's OLLAMA_NUM_PARALLEL); empty: as"
        " many as the server's slots.",
    )
    enabled = models.BooleanField(
        default=True,
        help_text="Off: no request is sent here and nothing loads it (its requests go to"
        " another server, or wait); loaded, it is unloaded once idle.",
    )
    pinned = models.BooleanField(default=False, help_text="Never evicted.")
    preload = models.BooleanField(default=False, help_text="Loaded when the worker starts.")
    keep_loaded_hours = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_keep_loaded_hours],
        help_text="When to keep it loaded, in SWITCHYARD_TIME_ZONE: mon-fri 08:00-18:00,"
        " sat 10:00-14:00. Then an idle server loads it (evicting idle models nobody waits"
        " for) and its idle TTL waits. Empty: never.",
    )
    idle_ttl_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Unload after this long unused."
    )
    expected_load_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="How long a load of it takes here, in seconds, until one is measured: what"
        " the scheduler and the ETAs expect of its first load. Empty: the same model's loads"
        " on other servers, else its size at the speed measured, else 10 s.",
    )
    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.UNLOADED
    )
    state_changed_at = models.DateTimeField(default=timezone.now)
    load_started_at = models.DateTimeField(null=True, blank=True)
    loaded_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_interactive_at = models.DateTimeField(null=True, blank=True)
    load_cause = models.CharField(
        max_length=16,
        blank=True,
        choices=LoadCause.choices,
        help_text="Who asked for its last load.",
    )
    displaced = models.BooleanField(
        default=False,
        help_text="Unloaded by Switchyard to make room for another load: an idle server may"
        " load it back (restore on idle).",
    )
    last_priority = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Priority class of the last request it served."
    )
    in_flight = models.PositiveIntegerField(default=0)
    load_progress = models.FloatField(null=True, blank=True)
    avg_load_s = models.FloatField(null=True, blank=True)
    avg_inference_s = models.FloatField(null=True, blank=True)
    load_failures = models.PositiveIntegerField(default=0)
    next_load_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_code = models.CharField(max_length=32, blank=True)
    worker = models.ForeignKey(
        "scheduler.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["server__name", "model__name"]
        constraints = [
            models.UniqueConstraint(fields=["server", "model"], name="one_deployment_per_server")
        ]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.server.name}"

    def effective_load_options(self) -> dict:
        return merged_load_options(self.model.load_options, self.load_options, self.load_overrides)


def merged_load_options(model_defaults: dict, own: dict, overrides: dict | None = None) -> dict:
    """A deployment's load options over its model's defaults, and its load's over both."""
    return {**model_defaults, **own, **(overrides or {})}
