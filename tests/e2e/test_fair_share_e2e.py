"""Fair share of runners end to end (usage.md): real daphne, the real runner program
with a small ``OMNIGENT_RUNNER_MAX_TURNS``, the mock LLM answering slowly. A turn over
the runner's capacity waits ``queued`` with its place, starts when a slot frees, survives
a server restart, and two server processes on PostgreSQL + Redis never go past a cap."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    restart_on_same_port,
    send_message,
    wait_turn,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SLOW_S = 3.0


def queued_turns(server: Server, session_id: str) -> list[dict[str, object]]:
    with server.client() as client:
        return list(client.get(f"/v1/sessions/{session_id}").json()["queued_turns"])


def turn_status(server: Server, session_id: str, response_id: str) -> str:
    with server.client() as client:
        body = client.get(f"/v1/sessions/{session_id}/responses/{response_id}").json()
    return str(body["status"])


def sessions_on(server: Server, runner: Runner, bundle: bytes, count: int) -> list[str]:
    ids = [create_session(server, bundle, title=f"fair {n}") for n in range(count)]
    for session_id in ids:
        bind(server, session_id, runner.runner_id)
    return ids


def accepted(server: Server, session_id: str, text: str) -> str:
    response = send_message(server, session_id, text)
    assert response.status_code == 202, response.text
    return str(response.json()["response_id"])


def test_a_turn_over_capacity_waits_queued_with_its_place_then_starts(
    server: Server,
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    runner = launch_runner(server, env={"OMNIGENT_RUNNER_MAX_TURNS": "1"})
    mock_llm.configure([{"text": "slow answer", "delay_s": SLOW_S}], match="slow")
    first, second = sessions_on(server, runner, make_bundle(), 2)

    running = accepted(server, first, "slow please")
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the first turn to reach the LLM")
    waiting = accepted(server, second, "quick please")
    assert turn_status(server, second, waiting) == "queued"
    assert queued_turns(server, second) == [{"response_id": waiting, "position": 1}]
    # The runner was not handed the second turn: the model saw one request only.
    assert len(mock_llm.requests) == 1

    assert wait_turn(server, first, running)["status"] == "completed"
    assert wait_turn(server, second, waiting)["status"] == "completed"
    assert queued_turns(server, second) == []
    assert len(mock_llm.requests) == 2


def test_queued_turns_start_after_a_server_restart(
    server: Server,
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    runner = launch_runner(server, env={"OMNIGENT_RUNNER_MAX_TURNS": "1"})
    mock_llm.configure([{"text": "slow answer", "delay_s": SLOW_S}], match="slow")
    first, second, third = sessions_on(server, runner, make_bundle(), 3)
    running = accepted(server, first, "slow please")
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the first turn to reach the LLM")
    waiting = [accepted(server, second, "quick one"), accepted(server, third, "quick two")]
    assert [queued_turns(server, s)[0]["position"] for s in (second, third)] == [1, 2]

    # The queue is in the database: a new process on it starts the waiting turns once
    # the runner is back and the slot frees.
    restarted = restart_on_same_port(server, tmp_path, "daphne-restarted", sig=signal.SIGTERM)
    try:
        assert wait_turn(restarted, first, running)["status"] == "completed"
        for session_id, response_id in zip((second, third), waiting, strict=True):
            assert wait_turn(restarted, session_id, response_id)["status"] == "completed"
        assert len(mock_llm.requests) == 3
    finally:
        restarted.process.stop()


def _overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment (an end before a start at the same time)."""
    points = sorted(
        [(start, 1) for start, _end in intervals] + [(end, -1) for _start, end in intervals],
        key=lambda point: (point[0], point[1]),
    )
    most = current = 0
    for _time, step in points:
        current += step
        most = max(most, current)
    return most


@pytest.mark.postgres
@pytest.mark.redis
def test_two_processes_never_start_more_than_the_runner_declared(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    postgres_url: str,
) -> None:
    """Messages arrive on both processes at once and turns end on the one that holds
    the tunnel: every turn runs once, and never more than 2 at a time."""
    server_a, server_b = two_servers
    runner = launch_runner(server_a, env={"OMNIGENT_RUNNER_MAX_TURNS": "2"})
    mock_llm.configure([{"text": "an answer", "delay_s": 0.5}] * 12)
    sessions = sessions_on(server_b, runner, make_bundle(), 8)
    responses: dict[str, str] = {}
    lock = threading.Lock()

    def send(session_id: str, server: Server) -> None:
        response_id = accepted(server, session_id, "go")
        with lock:
            responses[session_id] = response_id

    threads = [
        threading.Thread(target=send, args=(session_id, (server_a, server_b)[n % 2]))
        for n, session_id in enumerate(sessions)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(responses) == len(sessions)
    for session_id, response_id in responses.items():
        assert wait_turn(server_b, session_id, response_id)["status"] == "completed"
    assert len(mock_llm.requests) == len(sessions)  # each turn started once

    with psycopg.connect(postgres_url) as connection:
        rows = connection.execute(
            "SELECT dispatched_at, completed_at FROM agent_sessions_turn"
        ).fetchall()
    assert len(rows) == len(sessions)
    assert all(start is not None and end is not None for start, end in rows)
    assert _overlap([(start, end) for start, end in rows]) <= 2
