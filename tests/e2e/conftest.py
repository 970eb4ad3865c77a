"""Fixtures that start real processes: daphne, the runner program, the mock LLM."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    REDIS_URL,
    REPO,
    Runner,
    Server,
    base_env,
    bind,
    create_session,
    migrate,
    postgres_database,
    register_runner,
    send_message,
    start_runner,
    start_server,
    wait_until,
)
from testing.webhook_receiver import WebhookReceiver
from tests.conftest import IN_CI, require_service

pytestmark = pytest.mark.e2e


def _dump_logs(request: pytest.FixtureRequest, *processes: object) -> None:
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for process in processes:
            log = getattr(process, "log", lambda: "")()
            print(f"\n===== {getattr(process, 'name', '?')} log =====\n{log[-6000:]}")


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A webhook receiver on loopback (``testing/webhook_receiver.py``)."""
    with WebhookReceiver() as running:
        yield running


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def server_env(tmp: Path, **extra: str) -> dict[str, str]:
    settings = {
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        "OMNIGENT_DATA_DIR": str(tmp / "data"),
        "OMNIGENT_RECONNECT_GRACE_S": "3",
        "OMNIGENT_LOG_LEVEL": "INFO",
    }
    return base_env(**{**settings, **extra})


@pytest.fixture
def launch_server(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Server]]:
    """Start daphne processes on a fresh SQLite database, with extra settings if given."""
    started: list[Server] = []

    def launch(**settings: str) -> Server:
        env = server_env(tmp_path, **settings)
        migrate(env, tmp_path)
        srv = start_server(env=env, log_dir=tmp_path, name=f"daphne-{len(started)}")
        started.append(srv)
        return srv

    try:
        yield launch
    finally:
        _dump_logs(request, *(srv.process for srv in started))
        for srv in started:
            srv.process.stop()


@pytest.fixture
def server(launch_server: Callable[..., Server]) -> Server:
    """A daphne process on a fresh SQLite database with the in-memory channel layer."""
    return launch_server()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def in_git_checkout(path: Path) -> bool:
    return any((d / ".git").exists() for d in (path.resolve(), *path.resolve().parents))


@pytest.fixture
def plain_workspace(workspace: Path) -> Path:
    """The runner workspace outside any git checkout, as agent_edit mode needs.

    pytest's temporary folder is outside one on any usual machine; where it is not,
    the test cannot run: a skip with the reason, and a failure in CI.
    """
    if in_git_checkout(workspace):
        message = f"{workspace} is inside a git checkout: agent_edit mode cannot be tested"
        if IN_CI:
            pytest.fail(f"{message} (CI=true requires it)")
        pytest.skip(message)
    return workspace


@pytest.fixture
def launch_runner(
    mock_llm: MockLLMServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Runner]]:
    """Register and start runner programs (their LLM the mock); all stopped afterwards."""
    started: list[Runner] = []

    def launch(
        server: Server,
        *,
        workspace: Path | None = None,
        via_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Runner:
        """Register on ``server``; the runner dials ``via_url`` (a balancer) if given and
        gets ``env`` on top of its usual environment."""
        runner_id, token = register_runner(server)
        if workspace is None:
            workspace = tmp_path / f"workspace-{len(started)}"
            workspace.mkdir()
        front = server if via_url is None else replace(server, url=via_url)
        runner = start_runner(
            server=front,
            token=token,
            runner_id=runner_id,
            workspace=workspace,
            log_dir=tmp_path,
            extra_env={
                "OPENAI_BASE_URL": mock_llm.base_url,
                "OPENAI_API_KEY": "test-key",
                **(env or {}),
            },
            name=f"runner-{len(started)}",
        )
        started.append(runner)
        return runner

    try:
        yield launch
    finally:
        processes = [runner.process for runner in started if runner.process is not None]
        _dump_logs(request, *processes)
        for process in processes:
            process.stop()


@pytest.fixture
def runner(server: Server, workspace: Path, launch_runner: Callable[..., Runner]) -> Runner:
    """A registered runner program connected to ``server``, its LLM the mock."""
    return launch_runner(server, workspace=workspace)


# The price file of the priced server (docs/usage.md, Prices), in USD per million tokens.
PRICES = (
    "mock-model:\n"
    "  input_per_million: 1.0\n"
    "  output_per_million: 2.0\n"
    "  cache_read_per_million: 0.5\n"
)


def sync_prices(prices: Path, *, env: dict[str, str]) -> None:
    """Load the price file ``prices`` into the database ``env`` names. A test database
    may be a copy of one migrated before (testing.processes.migrate), whose
    migrate-time price load read another environment."""
    subprocess.run(
        [sys.executable, "manage.py", "sync_prices", "--file", str(prices)],
        cwd=REPO, env={**os.environ, **env}, check=True, capture_output=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def price_table() -> str:
    """The YAML prices ``priced_server`` serves; a test module overrides it for others."""
    return PRICES


@pytest.fixture
def priced_server(launch_server: Callable[..., Server], tmp_path: Path, price_table: str) -> Server:
    """A server with ``price_table`` as its prices, loaded before any call is priced."""
    prices = tmp_path / "prices.yaml"
    prices.write_text(price_table)
    server = launch_server(OMNIGENT_PRICES=str(prices))
    sync_prices(prices, env=server_env(tmp_path))
    return server


@pytest.fixture
def priced_runner(
    priced_server: Server, workspace: Path, launch_runner: Callable[..., Runner]
) -> Runner:
    return launch_runner(priced_server, workspace=workspace)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for multi-process tests, dropped afterwards."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    with postgres_database("omnigent_e2e_") as url:
        yield url


@pytest.fixture
def redis_url() -> str:
    require_service("Redis", "127.0.0.1", 6379)
    return REDIS_URL


@pytest.fixture
def two_servers(
    tmp_path: Path, postgres_url: str, redis_url: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Server, Server]]:
    """Two daphne processes sharing one PostgreSQL database and one Redis."""
    prefix = f"omnigent-e2e-{secrets.token_hex(4)}"
    env = base_env(
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        OMNIGENT_CHANNEL_PREFIX=prefix,
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        OMNIGENT_RECONNECT_GRACE_S="3",
    )
    migrate(env, tmp_path)
    first = start_server(env=env, log_dir=tmp_path, name="daphne-a")
    try:
        second = start_server(env=env, log_dir=tmp_path, name="daphne-b")
    except BaseException:
        first.process.stop()
        raise
    try:
        yield first, second
    finally:
        _dump_logs(request, first.process, second.process)
        first.process.stop()
        second.process.stop()


def orphan_a_turn(
    first: Server, runner: Runner, mock_llm: MockLLMServer, bundle: bytes
) -> tuple[str, str]:
    """Start a slow turn on ``first``, then kill ``first`` (SIGKILL: no disconnect
    handling, no grace timer) and stop the runner: the Runner row still names the dead
    process's channel and the runner never comes back. Returns (session, turn) ids."""
    mock_llm.configure([{"text": "too late", "delay_s": 30}])
    session_id = create_session(first, bundle)
    bind(first, session_id, runner.runner_id)
    response = send_message(first, session_id, "take your time")
    assert response.status_code == 202, response.text
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the turn to reach the LLM")
    first.process.kill()
    assert runner.process is not None
    runner.process.stop()
    return session_id, str(response.json()["response_id"])


__all__ = ["secrets"]
