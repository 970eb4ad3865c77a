"""Accidents with real processes (operations.md, "Accidents survived"): two server
processes on PostgreSQL + Redis, a runner, the mock LLM; each service is reached
through a ``testing.link_proxy.LinkProxy`` the test cuts, partitions or slows.

The machine's PostgreSQL and Redis are shared with other test runs, so they are not
restarted: a restart is simulated where the server sees it, on its connections. Every
connection is reset and new ones refused for the outage (what a restarting service's
clients see), and for Redis the run's keys are deleted too (what a Redis without
persistence has lost after a restart). The runner's link gets a 200 ms delay each way,
a 1 s stall on every 20th segment, and a partition of 5 s, five times the test's 1 s
tunnel heartbeat (the shipped heartbeat is 20 s; the spec's 30 s partition scaled alike).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.link_proxy import LinkProxy
from testing.mockllm import MockLLMServer
from testing.processes import (
    REDIS_URL,
    Runner,
    Server,
    StreamReader,
    base_env,
    bind,
    create_session,
    drop_redis_keys,
    is_final_idle,
    migrate,
    register_runner,
    send_message,
    start_runner,
    start_server,
    wait_runner_online,
    wait_turn,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(240)]

OUTAGE_S = 2.0
RECOVERY_S = 10.0  # operations.md: within 10 s of the service returning, everything works
POOL_TIMEOUT_S = 3.0


@dataclass
class Stack:
    servers: list[Server]
    runner: Runner
    pg: LinkProxy
    redis: LinkProxy
    link: LinkProxy
    prefix: str


@pytest.fixture
def stack(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    mock_llm: MockLLMServer,
    request: pytest.FixtureRequest,
) -> Iterator[Stack]:
    prefix = f"omnigent-accident-{secrets.token_hex(4)}"
    with contextlib.ExitStack() as exits:
        pg = LinkProxy(5432).start()
        exits.callback(pg.stop)
        redis = LinkProxy(6379).start()
        exits.callback(redis.stop)
        exits.callback(drop_redis_keys, prefix)
        database = postgres_url.replace(":5432/", f":{pg.port}/")
        env = base_env(
            DATABASE_URL=database,
            REDIS_URL=f"redis://127.0.0.1:{redis.port}/0",
            OMNIGENT_CHANNEL_PREFIX=prefix,
            OMNIGENT_DATA_DIR=str(tmp_path / "data"),
            OMNIGENT_HEARTBEAT_S="1",
            OMNIGENT_REDIS_SOCKET_TIMEOUT_S="6",
            OMNIGENT_REDIS_CONNECT_TIMEOUT_S="2",
            DATABASE_POOL_TIMEOUT_S=str(POOL_TIMEOUT_S),
        )
        migrate(env, tmp_path)
        with ThreadPoolExecutor(2) as pool:
            starting = [
                pool.submit(start_server, env=env, log_dir=tmp_path, name=f"daphne-{n}")
                for n in range(2)
            ]
            servers = [future.result() for future in starting]
        for server in servers:
            exits.callback(server.process.stop)
        first_port = int(servers[0].url.rsplit(":", 1)[1])
        link = LinkProxy(first_port).start()
        exits.callback(link.stop)
        runner_id, token = register_runner(servers[0])
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        runner = start_runner(
            server=replace(servers[0], url=f"http://127.0.0.1:{link.port}"),
            token=token,
            runner_id=runner_id,
            workspace=workspace,
            log_dir=tmp_path,
            extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        )
        assert runner.process is not None
        exits.callback(runner.process.stop)
        try:
            yield Stack(servers, runner, pg, redis, link, prefix)
        finally:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                for process in [s.process for s in servers] + [runner.process]:
                    print(f"\n===== {process.name} =====\n{process.log()[-5000:]}")


def start_slow_turn(
    stack: Stack, mock_llm: MockLLMServer, bundle: bytes, *, delay_s: float
) -> tuple[str, str]:
    """A session whose turn is with the model (for ``delay_s``) when this returns."""
    mock_llm.configure([{"text": "survived the accident", "delay_s": delay_s}])
    server = stack.servers[1]  # the HTTP side is not the process holding the tunnel
    session_id = create_session(server, bundle)
    bind(server, session_id, stack.runner.runner_id)
    response = send_message(server, session_id, "keep going")
    assert response.status_code == 202, response.text
    # configure() cleared the mock's request log: the first request is this turn's.
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the turn to reach the model")
    return session_id, str(response.json()["response_id"])


def replayed(server: Server, session_id: str, turns: int = 1) -> list[tuple[int | None, str, Any]]:
    """The whole event log, replayed from the start, until the session has gone idle (or
    failed) ``turns`` times; tried again (within the recovery time) while the process is
    still recovering."""

    def replay() -> list[tuple[int | None, str, Any]]:
        ends: list[int] = []

        def last_end(event: Any) -> bool:
            if is_final_idle(event):
                ends.append(1)
            return len(ends) >= turns

        stream = StreamReader(server, session_id, last_event_id=0, until=last_end)
        stream.wait(deadline_s=5)
        return stream.payloads()

    return list(wait_until(replay, deadline_s=RECOVERY_S, what="the stream to replay the log"))


def assert_log_whole(events: list[tuple[int | None, str, Any]]) -> None:
    ids = [event_id or 0 for event_id, _type, _data in events]
    assert ids and ids == list(range(ids[0], ids[0] + len(ids))), ids  # no gap, no repeat


def works_again(stack: Stack, mock_llm: MockLLMServer, bundle: bytes) -> float:
    """Seconds until a fresh turn completes end to end (through both processes)."""
    started = time.monotonic()
    mock_llm.configure([{"text": "back to normal"}])

    def completed() -> bool:
        session_id = create_session(stack.servers[1], bundle)
        bind(stack.servers[1], session_id, stack.runner.runner_id)
        response = send_message(stack.servers[1], session_id, "all good?")
        if response.status_code != 202:
            return False
        turn = wait_turn(
            stack.servers[0], session_id, response.json()["response_id"], deadline_s=RECOVERY_S
        )
        return turn["status"] == "completed"

    wait_until(completed, deadline_s=RECOVERY_S + 5, what="a turn to complete after the outage")
    return time.monotonic() - started


def test_redis_restarted_mid_turn(
    stack: Stack, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    bundle = make_bundle()
    session_id, response_id = start_slow_turn(stack, mock_llm, bundle, delay_s=OUTAGE_S + 1)
    stack.redis.cut()
    drop_redis_keys(stack.prefix, url=REDIS_URL)  # what a restarted Redis has lost
    time.sleep(OUTAGE_S)
    stack.redis.restore()
    restored = time.monotonic()
    turn = wait_turn(stack.servers[1], session_id, response_id, deadline_s=30)
    if turn["status"] != "completed":  # failing is allowed, visibly
        assert turn["status"] == "failed" and turn["error"]["message"], turn
    events = replayed(stack.servers[1], session_id)
    assert_log_whole(events)
    if turn["status"] == "completed":
        assert any(t == "response.completed" for _id, t, _d in events)
    wait_runner_online(stack.servers[0], stack.runner.runner_id, deadline_s=RECOVERY_S)
    works_again(stack, mock_llm, bundle)
    assert time.monotonic() - restored < RECOVERY_S + 15


def test_postgres_restarted_mid_turn(
    stack: Stack, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    bundle = make_bundle()
    session_id, response_id = start_slow_turn(stack, mock_llm, bundle, delay_s=OUTAGE_S + 1)
    stack.pg.cut()
    try:
        # A request during the outage: 503 with a clear error, not a hang.
        started = time.monotonic()
        with stack.servers[1].client() as client:
            during = client.get(f"/v1/sessions/{session_id}")
        elapsed = time.monotonic() - started
        assert during.status_code == 503, during.text
        assert during.json()["error"]["code"] == "service_unavailable", during.text
        assert "database" in during.json()["error"]["message"]
        assert elapsed < POOL_TIMEOUT_S + 3, elapsed
        remaining = OUTAGE_S - elapsed
        if remaining > 0:
            time.sleep(remaining)
    finally:
        stack.pg.restore()
    turn = wait_turn(stack.servers[1], session_id, response_id, deadline_s=40)
    if turn["status"] != "completed":
        assert turn["status"] == "failed" and turn["error"]["message"], turn
    assert_log_whole(replayed(stack.servers[1], session_id))
    wait_runner_online(stack.servers[0], stack.runner.runner_id, deadline_s=RECOVERY_S)
    works_again(stack, mock_llm, bundle)


def test_runner_link_delayed_stalled_and_partitioned(
    stack: Stack, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    bundle = make_bundle()
    stack.link.impair(delay_s=0.2, stall_every=20, stall_s=1.0)
    server = stack.servers[1]
    texts = [f"answer number {n} " + "word " * 40 for n in range(3)]
    mock_llm.configure([{"text": text, "stream": True} for text in texts])
    session_id = create_session(server, bundle)
    bind(server, session_id, stack.runner.runner_id)
    for n in range(2):
        response = send_message(server, session_id, f"question {n}")
        assert response.status_code == 202, response.text
        assert (
            wait_turn(server, session_id, response.json()["response_id"])["status"] == "completed"
        )

    # The third turn is with the model when the link goes down for 5 s.
    mock_llm.configure([{"text": texts[2], "stream": True, "delay_s": 1.0}])
    response = send_message(server, session_id, "question 2")
    assert response.status_code == 202, response.text
    stack.link.partition()
    time.sleep(5.0)
    stack.link.heal()
    turn = wait_turn(server, session_id, response.json()["response_id"], deadline_s=60)
    assert turn["status"] == "completed", turn

    events = replayed(server, session_id, turns=3)
    assert_log_whole(events)
    finished = [d for _id, t, d in events if t == "response.output_item.done"]
    said = [
        part["text"]
        for item in finished
        if item["item"].get("role") == "assistant"
        for part in item["item"].get("content", [])
        if part.get("type") == "output_text"
    ]
    assert [text.strip() for text in said] == [text.strip() for text in texts], said
    assert stack.link.stalls > 0
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/health").status_code == 200
