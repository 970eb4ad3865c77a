"""Production settings (issue 15, item 7; docs/deployment.md, "HTTPS").

With ``DJANGO_DEBUG=0`` and production-like settings ``check --deploy`` is clean at
WARNING level, the transport-security settings are on, each can be turned off by its
environment variable, and local single-user mode (plain HTTP on loopback, ``runlocal``)
keeps them off; the database configuration follows ``DATABASE_URL`` (the SQLite backend
that queues writers, PostgreSQL's server-side binding). Each case runs Django in a fresh
process, as settings are read once.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

SECURE = {
    "SECURE_SSL_REDIRECT": True,
    "SECURE_HSTS_SECONDS": 31536000,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    "SESSION_COOKIE_SECURE": True,
    "CSRF_COOKIE_SECURE": True,
}
NAMES = [*SECURE, "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER", "SECURE_REDIRECT_EXEMPT"]


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "OMNIGENT_", "DATABASE_", "REDIS_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="omnigent_site.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(48),  # 64 characters
        DJANGO_ALLOWED_HOSTS="sessions.example.com",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


def effective(tmp_path: Path, *, names: list[str] = NAMES, **extra: str) -> dict[str, object]:
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {names!r}}}, default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=production_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def startup_error(tmp_path: Path, **extra: str) -> str:
    """What Django printed as it refused to start with these settings."""
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env=production_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, "Django started"
    return result.stderr


def test_check_deploy_is_clean_with_production_settings(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=production_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_debug_off_gives_secure_defaults(tmp_path: Path) -> None:
    values = effective(tmp_path)
    assert {name: values[name] for name in SECURE} == SECURE
    assert values["SECURE_PROXY_SSL_HEADER"] is None  # opt-in: only a proxy can vouch for it
    # Load balancers probe and Prometheus scrapes over HTTP inside the deployment.
    assert values["SECURE_REDIRECT_EXEMPT"] == ["^health$", "^metrics$"]


def test_each_secure_default_can_be_turned_off(tmp_path: Path) -> None:
    values = effective(
        tmp_path,
        DJANGO_SECURE_SSL_REDIRECT="0",
        DJANGO_SECURE_HSTS_SECONDS="0",
        DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS="0",
        DJANGO_SESSION_COOKIE_SECURE="0",
        DJANGO_CSRF_COOKIE_SECURE="0",
        DJANGO_SECURE_HSTS_PRELOAD="1",
        DJANGO_SECURE_PROXY_SSL_HEADER="1",
        DJANGO_SECURE_REDIRECT_EXEMPT="",
    )
    assert {name: values[name] for name in SECURE} == {
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
    }
    assert values["SECURE_HSTS_PRELOAD"] is True
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert values["SECURE_REDIRECT_EXEMPT"] == []


def test_local_single_user_mode_keeps_plain_http(tmp_path: Path) -> None:
    """``runlocal`` (``make run``) serves http://127.0.0.1 in local single-user mode:
    with ``DJANGO_DEBUG=0`` there too, nothing may redirect it to HTTPS."""
    values = effective(tmp_path, OMNIGENT_LOCAL_SINGLE_USER="1")
    assert values["SECURE_SSL_REDIRECT"] is False
    assert values["SESSION_COOKIE_SECURE"] is False and values["CSRF_COOKIE_SECURE"] is False
    assert values["SECURE_HSTS_SECONDS"] == 0


def test_the_default_hosts_are_loopback_only(tmp_path: Path) -> None:
    """No test host in what a deployment answers to: Django's test set-up adds the test
    client's ``testserver`` for the tests (pytest-django runs it)."""
    env = production_env(tmp_path)
    del env["DJANGO_ALLOWED_HOSTS"]
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps(settings.ALLOWED_HOSTS))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["127.0.0.1", "localhost", "[::1]"]


def test_the_tests_answer_to_the_test_client_host(settings: Any) -> None:
    assert "testserver" in settings.ALLOWED_HOSTS


def test_debug_on_keeps_plain_http(tmp_path: Path) -> None:
    values = effective(tmp_path, DJANGO_DEBUG="1")
    assert values["SECURE_SSL_REDIRECT"] is False and values["SECURE_HSTS_SECONDS"] == 0


def database(tmp_path: Path, **extra: str) -> dict[str, Any]:
    """The ``default`` database as Django sees it with ``extra`` in the environment."""
    databases = effective(tmp_path, names=["DATABASES"], **extra)["DATABASES"]
    assert isinstance(databases, dict)
    return dict(databases["default"])


def test_sqlite_uses_the_backend_that_queues_writers(tmp_path: Path) -> None:
    db = database(tmp_path)
    assert db["ENGINE"] == "omnigent_site.runtime.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_postgresql_binds_parameters_on_the_server_unless_turned_off(tmp_path: Path) -> None:
    url = "postgres://postgres@127.0.0.1:5432/test"  # parsed only: nothing connects
    on = database(tmp_path, DATABASE_URL=url)
    assert on["ENGINE"] == "django.db.backends.postgresql"
    assert on["OPTIONS"]["server_side_binding"] is True
    off = database(tmp_path, DATABASE_URL=url, DATABASE_SERVER_SIDE_BINDING="0")
    assert off["OPTIONS"]["server_side_binding"] is False


def test_one_request_call_runs_at_once_on_sqlite_and_two_on_postgresql(tmp_path: Path) -> None:
    """SQLite's work is CPU in the process; PostgreSQL's waits on a socket
    (docs/performance-history.md, item 25). The variable overrides either."""
    names = ["OMNIGENT_REQUEST_THREADS_RUNNING"]
    url = "postgres://postgres@127.0.0.1:5432/test"  # parsed only: nothing connects
    assert effective(tmp_path, names=names) == {names[0]: 1}
    assert effective(tmp_path, names=names, DATABASE_URL=url) == {names[0]: 2}
    assert effective(tmp_path, names=names, OMNIGENT_REQUEST_THREADS_RUNNING="3") == {names[0]: 3}


def test_the_default_poll_rate_admits_a_client_polling_every_20_ms(tmp_path: Path) -> None:
    """Compatible clients follow a turn by polling the snapshot every 20 ms: the default
    poll rate admits that for as long as the turn runs; the user rate alone would not."""
    from omnigent_site.throttling import PollRateThrottle

    rates = effective(
        tmp_path, names=["OMNIGENT_THROTTLE_POLL_RATE", "OMNIGENT_THROTTLE_USER_RATE"]
    )
    parse = PollRateThrottle().parse_rate
    polls, seconds = parse(str(rates["OMNIGENT_THROTTLE_POLL_RATE"]))
    assert polls is not None and seconds is not None and polls / seconds >= 1 / 0.020
    requests, per = parse(str(rates["OMNIGENT_THROTTLE_USER_RATE"]))
    assert requests is not None and per is not None and requests / per < 1 / 0.020


def test_a_malformed_poll_rate_stops_the_server(tmp_path: Path) -> None:
    error = startup_error(tmp_path, OMNIGENT_THROTTLE_POLL_RATE="fast")
    assert "OMNIGENT_THROTTLE_POLL_RATE must look like 1200/min" in error


def test_the_shared_caches_follow_redis_url(tmp_path: Path) -> None:
    """The throttles' counts and the open-list mark are shared by every process through
    Redis when the deployment has it, each under its own key prefix."""
    alone = effective(tmp_path, names=["CACHES"])["CACHES"]
    assert isinstance(alone, dict)
    for alias in ("throttle", "presence"):
        assert alone[alias] == {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": alias,
        }
    shared = effective(
        tmp_path,
        names=["CACHES"],
        REDIS_URL="redis://redis.example:6379/0",
        OMNIGENT_CHANNEL_PREFIX="site-a",
    )["CACHES"]
    assert isinstance(shared, dict)
    for alias in ("throttle", "presence"):
        assert shared[alias]["BACKEND"] == "omnigent_site.runtime.redis_cache.RedisCacheWithRates"
        assert shared[alias]["LOCATION"] == "redis://redis.example:6379/0"
        assert shared[alias]["KEY_PREFIX"] == f"site-a:{alias}"
        # One connection pool per process, not one per request (test_redis_cache.py).
        assert (
            shared[alias]["OPTIONS"]["pool_class"]
            == "omnigent_site.runtime.redis_cache.ProcessConnectionPool"
        )


def test_webhook_delivery_is_server_unless_set_and_refuses_other_values(tmp_path: Path) -> None:
    names = ["OMNIGENT_WEBHOOK_DELIVERY"]
    assert effective(tmp_path, names=names) == {"OMNIGENT_WEBHOOK_DELIVERY": "server"}
    assert effective(tmp_path, names=names, OMNIGENT_WEBHOOK_DELIVERY=" Worker ") == {
        "OMNIGENT_WEBHOOK_DELIVERY": "worker"
    }
    error = startup_error(tmp_path, OMNIGENT_WEBHOOK_DELIVERY="workers")
    assert "OMNIGENT_WEBHOOK_DELIVERY must be one of server, worker, got 'workers'" in error
