"""Shared fixtures: users and API clients, bundles, and the real services CI provides."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rest_framework.test import APIClient

from omnigent_runner.bundles import build_bundle
from testing.mockllm import MockLLMServer

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Captured output with a lone surrogate (the hostile-input tests log such text) is
    escaped in the report: pytest-xdist sends reports to its controller as strict UTF-8,
    and one unencodable character would crash the worker and end the run."""
    report = yield
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report


def service_reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Use the real service; in CI its absence is a failure, elsewhere a clear skip."""
    if service_reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true requires it)")
    pytest.skip(f"{message}; start it to run this test")


@contextmanager
def on_redis(settings: Any, alias: str, **options: Any) -> Iterator[tuple[str, Any]]:
    """The cache ``alias`` on the real Redis (database 13), configured as the settings
    configure it for a deployment with Redis (plus ``options``), under a fresh key prefix
    for the block: yields the prefix and a client to look at the keys; deletes them after."""
    import secrets

    import redis

    from omnigent_site.settings import shared_cache

    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"omnigent-test-{secrets.token_hex(4)}:{alias}"
    config = shared_cache(alias, "redis://127.0.0.1:6379/13")
    settings.CACHES = {
        **settings.CACHES,
        alias: {**config, "KEY_PREFIX": prefix, "OPTIONS": {**config["OPTIONS"], **options}},
    }
    store = redis.Redis.from_url("redis://127.0.0.1:6379/13")
    try:
        yield prefix, store
    finally:
        keys = store.keys(f"{prefix}:*")
        if keys:
            store.delete(*keys)
        store.close()


def agent_yaml(name: str = "file-helper", *, extra: str = "") -> str:
    return (
        f"name: {name}\n"
        "description: Edits files.\n"
        "prompt: You edit files with the sys_os_* tools.\n"
        "executor:\n"
        "  model: mock-model\n" + extra
    )


@pytest.fixture
def make_bundle() -> Callable[..., bytes]:
    def make(name: str = "file-helper", *, extra: str = "") -> bytes:
        return build_bundle({"agent.yaml": agent_yaml(name, extra=extra)})

    return make


@pytest.fixture
def client_for(db: None) -> Callable[[str | None], APIClient]:
    """An API client that identifies as ``username`` through the proxy header."""

    def make(username: str | None) -> APIClient:
        client = APIClient()
        if username:
            client.credentials(HTTP_X_FORWARDED_EMAIL=username)
        return client

    return make


@pytest.fixture(autouse=True)
def _data_dir(tmp_path_factory: pytest.TempPathFactory, settings: object) -> None:
    """Bundles written by a test go to a private folder."""
    settings.DATA_DIR = tmp_path_factory.mktemp("data")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_client_limits(settings: object) -> None:
    """Request rates, open-stream bounds and sign-in limits off: the suite sends far more
    requests per user and minute than any client should. ``tests/api/test_client_limits.py``,
    ``tests/consumers/test_stream_limit_asgi.py`` and ``tests/api/test_signin_limits.py``
    turn them on with small values."""
    settings.OMNIGENT_THROTTLE_USER_RATE = ""  # type: ignore[attr-defined]
    settings.OMNIGENT_THROTTLE_RUNNER_RATE = ""  # type: ignore[attr-defined]
    settings.OMNIGENT_THROTTLE_POLL_RATE = ""  # type: ignore[attr-defined]
    settings.OMNIGENT_MAX_STREAMS_PER_USER = 0  # type: ignore[attr-defined]
    settings.OMNIGENT_SIGNIN_FAILURES_PER_USER = 0  # type: ignore[attr-defined]
    settings.OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS = 0  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_list_open() -> Iterator[None]:
    """No session list is open when a test starts (``sessions/list_watch.py``): a list
    stream of an earlier test would otherwise leave its mark for a minute."""
    from django.core.cache import caches

    caches["presence"].clear()
    yield
    caches["presence"].clear()


logging.getLogger("httpx").setLevel(logging.WARNING)


@pytest.fixture
def mock_llm() -> Iterator[MockLLMServer]:
    """The project's mock LLM, serving on a free local port for the test."""
    server = MockLLMServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
