"""Django settings: every knob is an environment variable with a working default.

The defaults give the embedded deployment (SQLite under ``var/``, the in-memory
channel layer, loopback only). ``DATABASE_URL`` and ``REDIS_URL`` switch to the
scaled-out deployment. docs/configuration.md lists every variable.
"""

from __future__ import annotations

import ipaddress
import os
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

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])


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
    "channels",
    "sessions.apps.AgentSessionsConfig",
    "runners.apps.RunnersConfig",
    "workspaces.apps.WorkspacesConfig",
]

# Django's standard middleware, with hooks that run inline under ASGI
# (omnigent_site/runtime/middleware.py explains why).
MIDDLEWARE = [
    "omnigent_site.runtime.middleware.InlineSecurityMiddleware",
    "omnigent_site.runtime.middleware.InlineSessionMiddleware",
    "omnigent_site.runtime.middleware.InlineCommonMiddleware",
    "omnigent_site.runtime.middleware.InlineCsrfViewMiddleware",
    "omnigent_site.runtime.middleware.InlineAuthenticationMiddleware",
    "omnigent_site.runtime.middleware.InlineMessageMiddleware",
    "omnigent_site.runtime.middleware.InlineXFrameOptionsMiddleware",
]

ROOT_URLCONF = "omnigent_site.urls"
ASGI_APPLICATION = "omnigent_site.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
DATABASES = {
    "default": dj_database_url.parse(
        _database_url,
        # Request threads are pooled (omnigent_site/runtime/handler.py), so a kept connection is
        # used again by later requests. SQLite keeps its connections by default; a
        # PostgreSQL connection goes back to the pool below after each database call.
        conn_max_age=env_int(
            "DATABASE_CONN_MAX_AGE", 300 if _database_url.startswith("sqlite") else 0
        ),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
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
# Runner tunnel (tunnel.md).
OMNIGENT_RUNNER_TUNNEL_TOKEN = env_list("OMNIGENT_RUNNER_TUNNEL_TOKEN", [])
OMNIGENT_RUNNER_OWNER = os.environ.get("OMNIGENT_RUNNER_OWNER", "local").strip() or "local"
OMNIGENT_HEARTBEAT_S = env_float("OMNIGENT_HEARTBEAT_S", 20.0)
OMNIGENT_HELLO_TIMEOUT_S = env_float("OMNIGENT_HELLO_TIMEOUT_S", 10.0)
OMNIGENT_RECONNECT_GRACE_S = env_float("OMNIGENT_RECONNECT_GRACE_S", 15.0)
OMNIGENT_RELAY_TIMEOUT_S = env_float("OMNIGENT_RELAY_TIMEOUT_S", 10.0)
# The largest WebSocket message (and frame) a runner may send: daphne's 1 MiB default
# becomes this (omnigent_site/runtime/server.py); 0 means no limit.
OMNIGENT_MAX_FRAME_BYTES = max(0, env_int("OMNIGENT_MAX_FRAME_BYTES", 16 * 1024 * 1024))
# Idle request threads kept for later requests (omnigent_site/runtime/handler.py).
OMNIGENT_REQUEST_THREADS_IDLE = max(0, env_int("OMNIGENT_REQUEST_THREADS_IDLE", 16))
# Session stream (http-api.md, Stream).
OMNIGENT_STREAM_HEARTBEAT_S = env_float("OMNIGENT_STREAM_HEARTBEAT_S", 15.0)
OMNIGENT_EVENT_RETENTION = env_int("OMNIGENT_EVENT_RETENTION", 1000)
OMNIGENT_STREAM_MAX_LAG = env_int("OMNIGENT_STREAM_MAX_LAG", 500)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "omnigent_site.authentication.ForwardedHeaderAuthentication",
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "omnigent_site.authentication.LocalSingleUserAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "omnigent_site.browsable.FormsBrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "EXCEPTION_HANDLER": "omnigent_site.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Omnigent session server API",
    "DESCRIPTION": "Agent sessions, runners, events, streams and workspace changes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": os.environ.get("OMNIGENT_LOG_LEVEL", "INFO").strip().upper() or "INFO",
    },
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # Django's own console handler would print each request warning a second time
        # (unformatted) in DEBUG mode: its records go to the root handler only.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # "HTTP/2 support not enabled" and the like at every start.
        "daphne.server": {"level": "WARNING"},
    },
}
