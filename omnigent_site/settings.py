"""Django settings: every knob is an environment variable with a working default.

The defaults give the embedded deployment (SQLite under ``var/``, the in-memory
channel layer, loopback only). ``DATABASE_URL`` and ``REDIS_URL`` switch to the
scaled-out deployment. docs/configuration.md lists every variable.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_int(name: str, default: int) -> int:
    return int(env_float(name, default))


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name, "").strip().lower() or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


DEBUG = env_bool("DJANGO_DEBUG", True)
DATA_DIR = Path(os.environ.get("OMNIGENT_DATA_DIR", str(BASE_DIR / "var" / "data")))


def local_secret_key(path: Path) -> str:
    """A random key made once for this data folder (mode 0600) and read back after.

    Without ``DJANGO_SECRET_KEY`` a development server still gets a key nobody else
    knows, and logins survive restarts; every process of the same setup (migrate,
    runlocal, daphne) reads the same file, and none of them warns about it.
    """
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of the same setup made it first
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(key + "\n")
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required when DJANGO_DEBUG=0")
    SECRET_KEY = local_secret_key(DATA_DIR / "secret-key")

# Loopback only. Django's test client's host ("testserver") is added by Django's test
# set-up (pytest-django runs it), not here.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])


INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "sessions.apps.AgentSessionsConfig",
    "runners.apps.RunnersConfig",
    "workspaces.apps.WorkspacesConfig",
    "webhook_outbox.apps.WebhookOutboxConfig",
    "webhooks.apps.WebhooksConfig",
    "audit.apps.AuditConfig",
    "usage.apps.UsageConfig",
    "schedules.apps.SchedulesConfig",
    "web.apps.WebConfig",
]

# Django's standard middleware. The server's ASGI handler runs each stock class as its
# inline-hooks equivalent (omnigent_site/runtime/middleware.py explains why); naming
# Django's own classes here keeps `check --deploy` checking what they do.
MIDDLEWARE = [
    # Request id in and out, log context, request metrics (omnigent_site/observability.py).
    "omnigent_site.observability.RequestObservationMiddleware",
    # Outermost: Django's own error pages on API paths become the error format.
    "omnigent_site.errors.ErrorFormatMiddleware",
    # API URLs whose path or query string is not UTF-8: 400 before anything decodes them.
    "omnigent_site.utf8_urls.Utf8UrlMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "omnigent_site.urls"
ASGI_APPLICATION = "omnigent_site.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The project's own overrides of library templates (the Redoc page).
        "DIRS": [BASE_DIR / "omnigent_site" / "templates"],
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

_default_db = f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"
_database_url = os.environ.get("DATABASE_URL", "") or _default_db
_on_sqlite = _database_url.startswith("sqlite")  # dj-database-url's sqlite:// schemes
DATABASES = {
    "default": dj_database_url.parse(
        _database_url,
        # Request threads are pooled (omnigent_site/runtime/handler.py), so a kept connection is
        # used again by later requests. SQLite keeps its connections by default; a
        # PostgreSQL connection goes back to the pool below after each database call.
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 300 if _on_sqlite else 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend with write transactions queued in the process instead of in
    # SQLite's sleeping busy handler (omnigent_site/runtime/sqlite3/base.py).
    DATABASES["default"]["ENGINE"] = "omnigent_site.runtime.sqlite3"
    # WAL and a busy timeout let the consumer and views write concurrently.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get(
        "DJANGO_TEST_SQLITE_NAME", str(BASE_DIR / "var" / "test.sqlite3")
    )
    # A fresh checkout has no var/ yet; SQLite does not create folders.
    for _sqlite_file in (DATABASES["default"]["NAME"], DATABASES["default"]["TEST"]["NAME"]):
        if _sqlite_file and str(_sqlite_file) != ":memory:":
            Path(_sqlite_file).parent.mkdir(parents=True, exist_ok=True)

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool(
    "DATABASE_POOL", True
):
    # Channels consumers close their connection after every database call, and each
    # server process runs many request threads: the pool makes both cheap and bounds
    # the connections a process holds.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env_int("DATABASE_POOL_MIN_SIZE", 2),
        "max_size": env_int("DATABASE_POOL_MAX_SIZE", 20),
        "timeout": env_float("DATABASE_POOL_TIMEOUT_S", 10.0),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Parameters sent apart from the SQL (psycopg's server-side binding) instead of
    # quoted into it in Python: less server CPU per statement (docs/configuration.md).
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = env_bool(
        "DATABASE_SERVER_SIDE_BINDING", True
    )


def scale_out_channel_layer(url: str) -> dict[str, Any]:
    """The Redis channel layer (docs/deployment.md, "Channel layer"): a read timeout
    that outlasts the layer's 5 s blocking receive (redis-py's default is 5 s too), yet
    still bounds a read on a dead connection."""
    return {
        "BACKEND": "omnigent_site.runtime.channel_layer.ScaleOutChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": url,
                    "socket_timeout": env_float("OMNIGENT_REDIS_SOCKET_TIMEOUT_S", 15.0),
                    "socket_connect_timeout": env_float("OMNIGENT_REDIS_CONNECT_TIMEOUT_S", 5.0),
                    "socket_keepalive": True,
                }
            ],
            "prefix": os.environ.get("OMNIGENT_CHANNEL_PREFIX", "omnigent"),
            "capacity": 1000,
            "expiry": 60,
        },
    }


REDIS_URL = os.environ.get("REDIS_URL", "").strip()
if REDIS_URL:
    CHANNEL_LAYERS = {"default": scale_out_channel_layer(REDIS_URL)}
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "omnigent_site.runtime.channel_layer.EmbeddedChannelLayer",
            "CONFIG": {"capacity": 1000, "expiry": 60},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", str(BASE_DIR / "var" / "static")))

CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False):
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# HTTPS only, by default, once DEBUG is off (deployment.md, "HTTPS"); local single-user
# mode serves plain HTTP on loopback (runlocal), so it keeps them off. Each has its own
# variable; `check --deploy` sees them because MIDDLEWARE names Django's own classes.
_HTTPS_ONLY = not DEBUG and not env_bool("OMNIGENT_LOCAL_SINGLE_USER", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", _HTTPS_ONLY)
SECURE_REDIRECT_EXEMPT = env_list("DJANGO_SECURE_REDIRECT_EXEMPT", [r"^health$", r"^metrics$"])
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if _HTTPS_ONLY else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", _HTTPS_ONLY)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", _HTTPS_ONLY)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", _HTTPS_ONLY)
# Preloading is the operator's commitment for a whole domain, never a default; W021
# only says it is off.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

# --- Omnigent -----------------------------------------------------------------
OMNIGENT_LOCAL_SINGLE_USER = env_bool("OMNIGENT_LOCAL_SINGLE_USER", False)
OMNIGENT_LOCAL_USER = "local"
OMNIGENT_AUTH_HEADER = os.environ.get("OMNIGENT_AUTH_HEADER", "X-Forwarded-Email").strip()
OMNIGENT_TRUSTED_PROXIES = env_list("OMNIGENT_TRUSTED_PROXIES", [])
for _proxy in OMNIGENT_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(
            f"OMNIGENT_TRUSTED_PROXIES: {_proxy!r} is not an address or network"
        ) from _exc
# Uploaded bundles are refused with 413 beyond this many bytes.
# A bundle travels base64-encoded inside ``session.open`` (12 MiB become 16 MiB of
# text); the runner accepts frames of up to 64 MiB from the server, which leaves
# room for the session's history.
OMNIGENT_MAX_BUNDLE_BYTES = env_int("OMNIGENT_MAX_BUNDLE_BYTES", 12 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = OMNIGENT_MAX_BUNDLE_BYTES + 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = OMNIGENT_MAX_BUNDLE_BYTES + 1024 * 1024
# The agent YAML inside a bundle (agents.md): refused beyond this many bytes before it is
# parsed. Runners read the same variable (omnigent_runner.bundles.max_yaml_bytes_from).
OMNIGENT_MAX_AGENT_YAML_BYTES = max(1, env_int("OMNIGENT_MAX_AGENT_YAML_BYTES", 1024 * 1024))
# Session files (files.md §1): the cap on one uploaded file's bytes (413 beyond it,
# enforced while the body streams in; see sessions/file_upload.py), and the slack the
# server allows on top of it for the multipart framing before it cuts a body off
# (omnigent_site/runtime/body_limit.py).
OMNIGENT_MAX_UPLOAD_BYTES = max(1, env_int("OMNIGENT_MAX_UPLOAD_BYTES", 20 * 1024 * 1024))
OMNIGENT_UPLOAD_OVERHEAD_BYTES = max(0, env_int("OMNIGENT_UPLOAD_OVERHEAD_BYTES", 64 * 1024))
# Runner tunnel (tunnel.md).
OMNIGENT_RUNNER_TUNNEL_TOKEN = env_list("OMNIGENT_RUNNER_TUNNEL_TOKEN", [])
OMNIGENT_RUNNER_OWNER = os.environ.get("OMNIGENT_RUNNER_OWNER", "local").strip() or "local"
OMNIGENT_HEARTBEAT_S = env_float("OMNIGENT_HEARTBEAT_S", 20.0)
OMNIGENT_HELLO_TIMEOUT_S = env_float("OMNIGENT_HELLO_TIMEOUT_S", 10.0)
OMNIGENT_RECONNECT_GRACE_S = env_float("OMNIGENT_RECONNECT_GRACE_S", 15.0)
OMNIGENT_RELAY_TIMEOUT_S = env_float("OMNIGENT_RELAY_TIMEOUT_S", 10.0)
# A message or tool result for a runner whose tunnel dropped less than this long ago
# (a server process restarting, a network blip) waits for it to come back instead of
# answering 503 at once (runners/dispatch.py); 0 turns the wait off.
OMNIGENT_RUNNER_RECONNECT_WAIT_S = max(0.0, env_float("OMNIGENT_RUNNER_RECONNECT_WAIT_S", 5.0))
# A ``turn.start`` sent fire and forget that the runner has not acknowledged this long
# after it went out is sent again by the process holding the runner's tunnel, which
# looks for such turns this often (runners/upkeep.py). Never before a message's own
# request has given up waiting for the ack (2 x OMNIGENT_RELAY_TIMEOUT_S); 0: off.
OMNIGENT_START_RESEND_S = max(0.0, env_float("OMNIGENT_START_RESEND_S", 10.0))
# How long HTTP requests in flight may go on once a server process is told to stop
# (SIGTERM); it stops listening at once (omnigent_site/runtime/shutdown.py).
OMNIGENT_SHUTDOWN_DRAIN_S = max(0.0, env_float("OMNIGENT_SHUTDOWN_DRAIN_S", 10.0))
# Fair share (usage.md): at most this many turns of one user run at once, across all
# runners; the rest wait ``queued`` (``runners/scheduler.py``). 0: no per-user cap.
OMNIGENT_MAX_RUNNING_TURNS_PER_USER = max(0, env_int("OMNIGENT_MAX_RUNNING_TURNS_PER_USER", 20))
# Scheduled tasks (automation.md): an occurrence missed while no server ran fires when
# a server comes back only if it is less than this late (else it is recorded skipped,
# "missed"); every process looks for due occurrences at least this often.
OMNIGENT_SCHEDULE_GRACE_S = max(0.0, env_float("OMNIGENT_SCHEDULE_GRACE_S", 300.0))
OMNIGENT_SCHEDULE_POLL_S = max(0.05, env_float("OMNIGENT_SCHEDULE_POLL_S", 1.0))
# How often a server process renews its liveness mark (runners/liveness.py); a process
# silent for 3 of these is taken for dead and its tunnels read offline.
OMNIGENT_PROCESS_BEAT_S = max(0.1, env_float("OMNIGENT_PROCESS_BEAT_S", 5.0))
# The largest WebSocket message (and frame) a runner may send: daphne's 1 MiB default
# becomes this (omnigent_site/runtime/server.py); 0 means no limit.
OMNIGENT_MAX_FRAME_BYTES = max(0, env_int("OMNIGENT_MAX_FRAME_BYTES", 16 * 1024 * 1024))
# The workspace through the server (files.md §2): a file read's content cap (longer
# files come back ``truncated``; ``?download=1`` streams them whole) and a write's cap.
OMNIGENT_WORKSPACE_READ_MAX_BYTES = max(
    1, env_int("OMNIGENT_WORKSPACE_READ_MAX_BYTES", 2 * 1024 * 1024)
)
OMNIGENT_WORKSPACE_WRITE_MAX_BYTES = max(
    1, env_int("OMNIGENT_WORKSPACE_WRITE_MAX_BYTES", 10 * 1024 * 1024)
)
# A JSON write body carries the bytes as base64 (4/3 of them): room for the largest.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(
    DATA_UPLOAD_MAX_MEMORY_SIZE, OMNIGENT_WORKSPACE_WRITE_MAX_BYTES * 4 // 3 + 1024 * 1024
)
# JSON nesting allowed in request bodies (runner frames: this plus a small margin);
# deeper is a 400 before anything is stored (omnigent_runner/json_text.py).
OMNIGENT_MAX_JSON_DEPTH = env_int("OMNIGENT_MAX_JSON_DEPTH", 64)
if not 1 <= OMNIGENT_MAX_JSON_DEPTH <= 256:
    raise ImproperlyConfigured("OMNIGENT_MAX_JSON_DEPTH must be between 1 and 256")
# Idle request threads kept for later requests (omnigent_site/runtime/handler.py).
OMNIGENT_REQUEST_THREADS_IDLE = max(0, env_int("OMNIGENT_REQUEST_THREADS_IDLE", 16))
# How many requests run their sync code at once (runtime/running_gate.py); 0: no limit.
# SQLite's work is CPU in this process, so one at a time contends least; PostgreSQL's
# waits on a socket, and a second running call uses the time (docs/performance.md).
OMNIGENT_REQUEST_THREADS_RUNNING = max(
    0,
    env_int(
        "OMNIGENT_REQUEST_THREADS_RUNNING",
        1 if _on_sqlite else 2,
    ),
)
# Session stream (http-api.md, Stream).
OMNIGENT_STREAM_HEARTBEAT_S = env_float("OMNIGENT_STREAM_HEARTBEAT_S", 15.0)
OMNIGENT_EVENT_RETENTION = env_int("OMNIGENT_EVENT_RETENTION", 1000)
# Retention and audit (lifecycle.md; sessions/retention.py). Days; unset or 0 keeps forever.
OMNIGENT_ARCHIVE_AFTER_DAYS = env_int("OMNIGENT_ARCHIVE_AFTER_DAYS", 0)
OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS = env_int("OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS", 0)
OMNIGENT_EVENT_LOG_KEEP_DAYS = env_int("OMNIGENT_EVENT_LOG_KEEP_DAYS", 30)
OMNIGENT_AUDIT_KEEP_DAYS = env_int("OMNIGENT_AUDIT_KEEP_DAYS", 365)
# The YAML price table (docs/usage.md); empty: the shipped usage/default_prices.yaml.
OMNIGENT_PRICES = os.environ.get("OMNIGENT_PRICES", "").strip()
# Each user's budget per UTC day in USD unless staff set their own (usage.md, Budgets);
# unset: none.
OMNIGENT_DAILY_BUDGET_USD: float | None = (
    env_float("OMNIGENT_DAILY_BUDGET_USD", 0.0)
    if os.environ.get("OMNIGENT_DAILY_BUDGET_USD", "").strip()
    else None
)
if OMNIGENT_DAILY_BUDGET_USD is not None and not 0 <= OMNIGENT_DAILY_BUDGET_USD < 1e9:
    raise ImproperlyConfigured("OMNIGENT_DAILY_BUDGET_USD must be a number of dollars >= 0")
# How often the retention job runs (once across all server processes).
OMNIGENT_RETENTION_INTERVAL_S = env_float("OMNIGENT_RETENTION_INTERVAL_S", 86400.0)
# The session-list stream's log (sessions/updates.py): each user's last this many list
# events, and all of the last this many seconds, whichever keeps more.
OMNIGENT_LIST_EVENT_RETENTION = max(1, env_int("OMNIGENT_LIST_EVENT_RETENTION", 1000))
OMNIGENT_LIST_EVENT_RETENTION_S = max(0.0, env_float("OMNIGENT_LIST_EVENT_RETENTION_S", 600.0))
OMNIGENT_STREAM_MAX_LAG = env_int("OMNIGENT_STREAM_MAX_LAG", 500)
# Rendered session snapshots kept per process for pollers (sessions/snapshot_cache.py);
# 0 keeps none.
OMNIGENT_SNAPSHOT_CACHE_ENTRIES = max(0, env_int("OMNIGENT_SNAPSHOT_CACHE_ENTRIES", 1024))
# Limits on clients (http-api.md; omnigent_site/throttling.py, stream_slots.py): request
# rates ("<n>/<second|minute|hour|day>", "" or 0 for none) and open streams per user
# (0 for none); all off in local single-user mode.
OMNIGENT_THROTTLE_USER_RATE = os.environ.get("OMNIGENT_THROTTLE_USER_RATE", "1200/min").strip()
OMNIGENT_THROTTLE_RUNNER_RATE = os.environ.get("OMNIGENT_THROTTLE_RUNNER_RATE", "600/min").strip()
# Snapshot polls have their own per-user rate: a compatible client polls every 20 ms
# (3,000 a minute), which the user rate alone would refuse after 24 s.
OMNIGENT_THROTTLE_POLL_RATE = os.environ.get("OMNIGENT_THROTTLE_POLL_RATE", "6000/min").strip()
OMNIGENT_MAX_STREAMS_PER_USER = max(0, env_int("OMNIGENT_MAX_STREAMS_PER_USER", 50))
# Failed sign-ins (omnigent_site/signin_limits.py): per user name and per client
# address, each per window; 0 turns a limit off.
OMNIGENT_SIGNIN_FAILURES_PER_USER = max(0, env_int("OMNIGENT_SIGNIN_FAILURES_PER_USER", 5))
OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS = max(0, env_int("OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS", 20))
OMNIGENT_SIGNIN_WINDOW_S = max(0.0, env_float("OMNIGENT_SIGNIN_WINDOW_S", 900.0))
AUTHENTICATION_BACKENDS = ["omnigent_site.signin_limits.RateLimitedModelBackend"]
for _name in (
    "OMNIGENT_THROTTLE_USER_RATE",
    "OMNIGENT_THROTTLE_RUNNER_RATE",
    "OMNIGENT_THROTTLE_POLL_RATE",
):
    if not re.fullmatch(r"|0|[0-9]+/(s|m|h|d)[a-z]*", globals()[_name]):
        raise ImproperlyConfigured(f"{_name} must look like 1200/min (or be 0 for no limit)")


def shared_cache(name: str, redis_url: str) -> dict[str, Any]:
    """A cache every server process shares: on Redis when the deployment has it, else in
    this (then the only) process's memory."""
    if not redis_url:
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": name}
    return {
        # Django's Redis cache, plus the throttles' one-trip check (runtime/redis_cache.py).
        "BACKEND": "omnigent_site.runtime.redis_cache.RedisCacheWithRates",
        "LOCATION": redis_url,
        "KEY_PREFIX": os.environ.get("OMNIGENT_CHANNEL_PREFIX", "omnigent") + f":{name}",
        "OPTIONS": {
            "socket_timeout": 2.0,
            "socket_connect_timeout": 2.0,
            # One pool per process, not one per request (omnigent_site/runtime/redis_cache.py).
            "pool_class": "omnigent_site.runtime.redis_cache.ProcessConnectionPool",
        },
    }


CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # The throttles' counts (omnigent_site/throttling.py).
    "throttle": shared_cache("throttle", REDIS_URL),
    # Whether a session list is open anywhere (sessions/list_watch.py).
    "presence": shared_cache("presence", REDIS_URL),
}
# Approvals (approvals.md): the cap on how long a question waits, and how often every
# server process looks for questions past their deadline.
OMNIGENT_ASK_TIMEOUT_S = env_float("OMNIGENT_ASK_TIMEOUT_S", 3600.0)
# Webhooks (automation.md, docs/automation.md). Plain http:// and private, loopback or
# link-local receivers are refused unless these are set; local single-user mode allows both.
OMNIGENT_WEBHOOK_ALLOW_HTTP = env_bool("OMNIGENT_WEBHOOK_ALLOW_HTTP", False)
OMNIGENT_WEBHOOK_ALLOW_PRIVATE = env_bool("OMNIGENT_WEBHOOK_ALLOW_PRIVATE", False)
# One attempt's deadline (name resolution, connection, request, response).
OMNIGENT_WEBHOOK_TIMEOUT_S = max(0.1, env_float("OMNIGENT_WEBHOOK_TIMEOUT_S", 10.0))
# The delays between attempts (seconds, each ± 10 %); after the last, a delivery fails.
OMNIGENT_WEBHOOK_RETRY_S = [
    float(delay)
    for delay in env_list(
        "OMNIGENT_WEBHOOK_RETRY_S", ["5", "30", "120", "600", "3600", "21600", "86400"]
    )
]
# A webhook is disabled after this many events in a row failed (0: never).
OMNIGENT_WEBHOOK_DISABLE_AFTER = max(0, env_int("OMNIGENT_WEBHOOK_DISABLE_AFTER", 20))
# How often each server process looks for events written by other processes.
OMNIGENT_WEBHOOK_POLL_S = max(0.05, env_float("OMNIGENT_WEBHOOK_POLL_S", 1.0))
# Finished deliveries (and their events) are deleted after this many days.
OMNIGENT_WEBHOOK_RETENTION_DAYS = max(0.0, env_float("OMNIGENT_WEBHOOK_RETENTION_DAYS", 7.0))
# Who sends the deliveries: ``server`` (every server process) or ``worker`` (only
# processes running ``manage.py deliverwebhooks``; the server processes then only
# write the events).
OMNIGENT_WEBHOOK_DELIVERY = env_choice("OMNIGENT_WEBHOOK_DELIVERY", ("server", "worker"), "server")
# Attempts in flight per server process.
OMNIGENT_WEBHOOK_CONCURRENCY = max(1, env_int("OMNIGENT_WEBHOOK_CONCURRENCY", 32))
OMNIGENT_APPROVAL_SWEEP_S = env_float("OMNIGENT_APPROVAL_SWEEP_S", 5.0)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "omnigent_site.authentication.ForwardedHeaderAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "omnigent_site.authentication.LocalSingleUserAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        # DRF's JSON with a final newline (omnigent_site/renderers.py).
        "omnigent_site.renderers.JSONRenderer",
        "omnigent_site.browsable.FormsBrowsableAPIRenderer",
    ],
    # JSON only: the upload endpoints name their multipart parsers themselves, and a
    # form body anywhere else is 415 (omnigent_site/cross_site.py).
    "DEFAULT_PARSER_CLASSES": ["omnigent_site.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "omnigent_site.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": [
        "omnigent_site.throttling.UserRateThrottle",
        "omnigent_site.throttling.PollRateThrottle",
        "omnigent_site.throttling.RunnerRateThrottle",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Omnigent session server API",
    "DESCRIPTION": "Agent sessions, runners, events, streams and workspace changes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI and Redoc from drf-spectacular-sidecar's static files: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "omnigent_site.schema.document_rate_limits",
        "omnigent_site.schema.document_cross_site_refusals",
    ],
}

# Metrics (operations.md; omnigent_site/metrics.py): GET /metrics, off by default; with
# a token, only for ``Authorization: Bearer <token>``. prometheus-client's multi-process
# mode reads PROMETHEUS_MULTIPROC_DIR when it is imported, so it is set here, before
# anything imports it: every server process of a machine shares the folder.
OMNIGENT_METRICS = env_bool("OMNIGENT_METRICS", False)
OMNIGENT_METRICS_TOKEN = os.environ.get("OMNIGENT_METRICS_TOKEN", "").strip()
if OMNIGENT_METRICS and not os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip():
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(BASE_DIR / "var" / "metrics")
if OMNIGENT_METRICS:
    Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)

_LOG_LEVEL = os.environ.get("OMNIGENT_LOG_LEVEL", "INFO").strip().upper() or "INFO"
# Libraries that log routine chatter at INFO show it only when the level is DEBUG.
_CHATTER_LEVEL = "DEBUG" if _LOG_LEVEL == "DEBUG" else "WARNING"
# Human lines by default; ``json``: one JSON object per line, daphne's access log
# included (omnigent_site/observability.py, runtime/server.py). Either way every record
# gets the request id, user, session and runner when known.
OMNIGENT_LOG_FORMAT = os.environ.get("OMNIGENT_LOG_FORMAT", "").strip().lower() or "text"
if OMNIGENT_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured("OMNIGENT_LOG_FORMAT must be text or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "omnigent_site.observability.JsonLogFormatter"},
    },
    "filters": {"context": {"()": "omnigent_site.observability.LogContextFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if OMNIGENT_LOG_FORMAT == "json" else "plain",
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": _LOG_LEVEL},
    "loggers": {
        # "Starting server at tcp:port=8000:interface=127.0.0.1": the runtime's own line
        # says where to go (omnigent_site/runtime/server.py).
        "daphne.cli": {"level": _CHATTER_LEVEL},
        # One line per HTTP request made with httpx (runlocal's health checks).
        "httpx": {"level": _CHATTER_LEVEL},
        "django.channels.server": {"level": "WARNING"},
        # Django's own console handler would print each request warning a second time
        # (unformatted) in DEBUG mode: its records go to the root handler only.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # "HTTP/2 support not enabled" and the like at every start.
        "daphne.server": {"level": "WARNING"},
    },
}
