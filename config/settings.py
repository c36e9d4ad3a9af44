"""Settings, all read from the environment (see .env.example and docs/operating.md)."""

import os
import re
import secrets
import tempfile
import warnings
import zoneinfo
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Off unless set: `make run` turns it on for the demo only.
DEBUG = env.bool("DEBUG", default=False)


def _secret_key() -> str:
    """Unset, a key is generated once and kept beside the project (readable by its owner
    only), so one machine's processes share it. Several machines must share one: set it."""
    if key := env.str("SECRET_KEY", default=""):
        return key
    path = BASE_DIR / ".secret_key"
    if not path.exists():
        # Written aside, then linked into place: of processes starting at once, one key wins
        # and none reads a half-written file.
        fd, aside = tempfile.mkstemp(dir=BASE_DIR, prefix=".secret_key.")  # mode 0600
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(50))
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(aside)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Reached over HTTPS through a reverse proxy that sets X-Forwarded-Proto itself: the login's
# cookies go over HTTPS only, and Django knows which requests came over HTTPS. The proxy
# redirects plain HTTP (a probe of /healthz on the machine itself may stay plain).
if env.bool("BEHIND_TLS_PROXY", default=False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env.int("HSTS_SECONDS", default=0)
    SILENCED_SYSTEM_CHECKS = ["security.W008"]  # Django's own redirect: the proxy's job

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "backends",
    "scheduler",
    "dashboard",
    "access",
    "batches",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web process read while the worker writes; IMMEDIATE takes the write
        # lock up front so two writers queue on busy_timeout instead of deadlocking.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # A file (not :memory:) so live servers and worker threads in tests see the same rows;
    # one per process so parallel test runs never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f"test-{os.getpid()}.sqlite3")}
else:
    # Django's backend, less a round trip per transaction (config/postgresql/base.py).
    DATABASES["default"]["ENGINE"] = "config.postgresql"
    # A pool per process: a request borrows a connection per burst of queries instead of
    # opening one (a new backend process) per HTTP request.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env.int("DATABASE_POOL_SIZE", default=20),
        "timeout": 30,
    }
    DATABASES["default"].setdefault("TEST", {})["NAME"] = f"test_switchyard_{os.getpid()}"
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "config.postgresql"
# Session state: wrong behind a pooler that hands one server session to many clients.
PREPARED_STATEMENTS = IS_POSTGRES and env.bool("DATABASE_PREPARED_STATEMENTS", default=True)

REDIS_URL = env.str("REDIS_URL", default="")
# Redis's database number does not separate pub/sub: installations sharing one Redis each
# need a prefix of their own.
REDIS_PREFIX = env.str("REDIS_PREFIX", default="asgi")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub: a hint is one PUBLISH, and a process's subscriber connection delivers
            # it with no command per message. Hints are not stored: a listener that was not
            # subscribed re-reads the database (the truth) instead.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": REDIS_PREFIX},
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": 10_000},
        }
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One time format everywhere: ISO-like, zone shown (config/formats/en/formats.py).
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# With the finders the apps' files are served without `collectstatic`: its folder missing
# (a first run, `manage.py serve`) is no reason to warn at every start.
warnings.filterwarnings("ignore", message=re.escape(f"No directory at: {STATIC_ROOT}"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/admin/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_PARSER_CLASSES": ["scheduler.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "scheduler.api.errors.openai_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchyard API",
    "DESCRIPTION": "OpenAI-compatible inference and async jobs in front of local LLM servers."
    " Every error is JSON in the OpenAI shape (the Error schema).",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # A key's max and default priority are the one set of class names.
    "ENUM_NAME_OVERRIDES": {"PriorityClassEnum": "scheduler.api.keys.CLASS_NAMES"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "scheduler.api.openapi.complete",
        "scheduler.api.ollama_openapi.complete",
    ],
    # /api/docs/ serves Swagger UI from the drf-spectacular-sidecar package, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# API keys (docs/operating.md, "API keys and limits"): `required`, or `off` for one person
# on a laptop (anyone who reaches the port then sees and does everything).
SWITCHYARD_AUTH = env.str("SWITCHYARD_AUTH", default="required").strip().lower()
if SWITCHYARD_AUTH not in ("required", "off"):
    raise ImproperlyConfigured(f"SWITCHYARD_AUTH must be required or off, not {SWITCHYARD_AUTH!r}")
# A bearer token that may read /metrics (a Prometheus scraper); staff sessions may too.
METRICS_TOKEN = env.str("SWITCHYARD_METRICS_TOKEN", default="")

# Job callbacks (callback_url) go only to these hosts, signed with this secret.
WEBHOOK_HOSTS = env.list("SWITCHYARD_WEBHOOK_HOSTS", default=[])
WEBHOOK_SECRET = env.str("SWITCHYARD_WEBHOOK_SECRET", default="")

# Scheduler knobs; the unit is in the name.
SWITCHYARD = {
    "POLL_INTERVAL_S": env.float("SWITCHYARD_POLL_INTERVAL_S", default=5.0),
    "HEARTBEAT_S": env.float("SWITCHYARD_HEARTBEAT_S", default=5.0),
    "WORKER_STALE_S": env.float("SWITCHYARD_WORKER_STALE_S", default=30.0),
    "STATUS_SYNC_S": env.float("SWITCHYARD_STATUS_SYNC_S", default=10.0),
    "DRAIN_S": env.float("SWITCHYARD_DRAIN_S", default=30.0),
    "KEEP_FINISHED_DAYS": env.float("SWITCHYARD_KEEP_FINISHED_DAYS", default=30.0),
    "WAITING_COMMENT_S": env.float("SWITCHYARD_WAITING_COMMENT_S", default=5.0),
    "STREAM_PROGRESS": env.str("SWITCHYARD_STREAM_PROGRESS", default="comments"),
    "MAX_QUEUE": env.int("SWITCHYARD_MAX_QUEUE", default=1000),
    "MAX_QUEUE_INTERACTIVE": env.int("SWITCHYARD_MAX_QUEUE_INTERACTIVE", default=0),
    "MAX_QUEUE_HIGH": env.int("SWITCHYARD_MAX_QUEUE_HIGH", default=0),
    "MAX_QUEUE_NORMAL": env.int("SWITCHYARD_MAX_QUEUE_NORMAL", default=0),
    "MAX_QUEUE_BACKGROUND": env.int("SWITCHYARD_MAX_QUEUE_BACKGROUND", default=0),
    "MAX_WAIT_INTERACTIVE_S": env.float("SWITCHYARD_MAX_WAIT_INTERACTIVE_S", default=120.0),
    "MAX_WAIT_HIGH_S": env.float("SWITCHYARD_MAX_WAIT_HIGH_S", default=300.0),
    "MAX_WAIT_NORMAL_S": env.float("SWITCHYARD_MAX_WAIT_NORMAL_S", default=600.0),
    "MAX_WAIT_BACKGROUND_S": env.float("SWITCHYARD_MAX_WAIT_BACKGROUND_S", default=3600.0),
    "AGING_STEP_S": env.float("SWITCHYARD_AGING_STEP_S", default=150.0),
    "MIN_RESIDENCY_S": env.float("SWITCHYARD_MIN_RESIDENCY_S", default=30.0),
    "WARM_WINDOW_S": env.float("SWITCHYARD_WARM_WINDOW_S", default=120.0),
    "NORMAL_WARM_WINDOW_S": env.float("SWITCHYARD_NORMAL_WARM_WINDOW_S", default=60.0),
    "ACTIVITY_WINDOW_S": env.float("SWITCHYARD_ACTIVITY_WINDOW_S", default=300.0),
    "PARALLEL_LOAD_QUEUE": env.int("SWITCHYARD_PARALLEL_LOAD_QUEUE", default=2),
    "NO_SERVER_GRACE_S": env.float("SWITCHYARD_NO_SERVER_GRACE_S", default=15.0),
    # How long an eviction lets requests on its victim that Switchyard did not send finish.
    "OUTSIDE_GRACE_S": env.float("SWITCHYARD_OUTSIDE_GRACE_S", default=30.0),
    "RESCUE_S": env.float("SWITCHYARD_RESCUE_S", default=30.0),
    "RESTORE_WINDOW_S": env.float("SWITCHYARD_RESTORE_WINDOW_S", default=3600.0),
    # How far back a conversation's last turn is looked for (prompt-cache affinity); 0: off.
    "CACHE_AFFINITY_S": env.float("SWITCHYARD_CACHE_AFFINITY_S", default=1800.0),
    # The longest a job may ask to wait (its `max_wait_s`).
    "MAX_JOB_WAIT_S": env.float("SWITCHYARD_MAX_JOB_WAIT_S", default=86_400.0),
    # Batches (OpenAI's Batch API): requests a batch may hold, and an uploaded file's size.
    "BATCH_MAX_REQUESTS": env.int("SWITCHYARD_BATCH_MAX_REQUESTS", default=10_000),
    "MAX_FILE_MB": env.int("SWITCHYARD_MAX_FILE_MB", default=100),
    # The team's time zone, in which deployments' keep-loaded hours are read.
    "TIME_ZONE": env.str("SWITCHYARD_TIME_ZONE", default="UTC"),
    "URGENT_LOAD_S": env.float("SWITCHYARD_URGENT_LOAD_S", default=20.0),
    "RETRY_BASE_S": env.float("SWITCHYARD_RETRY_BASE_S", default=2.0),
    "RETRY_MAX_S": env.float("SWITCHYARD_RETRY_MAX_S", default=15.0),
    "LOAD_ATTEMPTS": env.int("SWITCHYARD_LOAD_ATTEMPTS", default=3),
    "REQUEST_ATTEMPTS": env.int("SWITCHYARD_REQUEST_ATTEMPTS", default=3),
    "BREAKER_FAILURES": env.int("SWITCHYARD_BREAKER_FAILURES", default=3),
    "BREAKER_COOLDOWN_S": env.float("SWITCHYARD_BREAKER_COOLDOWN_S", default=60.0),
    "SIM_SPEED": env.float("SWITCHYARD_SIM_SPEED", default=1.0),
    "CONNECT_TIMEOUT_S": env.float("SWITCHYARD_CONNECT_TIMEOUT_S", default=5.0),
    "READ_TIMEOUT_S": env.float("SWITCHYARD_READ_TIMEOUT_S", default=600.0),
    # How long a web process trusts a key it checked: a revoked key stops within it.
    "AUTH_CACHE_S": env.float("SWITCHYARD_AUTH_CACHE_S", default=2.0),
    "WEBHOOK_ATTEMPTS": env.int("SWITCHYARD_WEBHOOK_ATTEMPTS", default=8),
    "WEBHOOK_RETRY_MAX_S": env.float("SWITCHYARD_WEBHOOK_RETRY_MAX_S", default=60.0),
    "WEBHOOK_TIMEOUT_S": env.float("SWITCHYARD_WEBHOOK_TIMEOUT_S", default=10.0),
    # PostgreSQL: let the commits the system redoes by itself skip the WAL flush
    # (docs/operating.md, "Durability"). Off: every commit waits for the disk.
    "SKIP_FLUSH": env.bool("SWITCHYARD_SKIP_FLUSH", default=False),
    # The worker's fast paths (scheduler/runtime/fast_paths.py): off, every request waits
    # for a pass and its end reaches its caller by the channel layer alone.
    "FAST_PATHS": env.bool("SWITCHYARD_FAST_PATHS", default=True),
}
# How a streamed chat shows its wait (docs/api.md): checked here, not on every request.
try:
    zoneinfo.ZoneInfo(SWITCHYARD["TIME_ZONE"])
except (zoneinfo.ZoneInfoNotFoundError, ValueError) as error:
    raise ImproperlyConfigured(
        f"SWITCHYARD_TIME_ZONE must be a time zone such as Europe/Paris, not"
        f" {SWITCHYARD['TIME_ZONE']!r}"
    ) from error
if SWITCHYARD["STREAM_PROGRESS"] not in ("comments", "reasoning"):
    raise ImproperlyConfigured(
        "SWITCHYARD_STREAM_PROGRESS must be comments or reasoning, not "
        f"{SWITCHYARD['STREAM_PROGRESS']!r}"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
    },
}
