"""Long waits hold no PostgreSQL pool connection.

A stream stays open as long as its watcher, and a relayed request waits for the
runner up to the relay deadline. If either kept the database connection of its
first lookup, a few dozen of them would check out the whole pool and every other
request would wait for it and fail. Each test runs with a pool far smaller than
the number of waiters.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    bind,
    create_session,
    is_final_idle,
    send_message,
    wait_turn,
    wait_until,
)

from .test_tunnel_e2e import WEATHER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(180)]

POOL = {"DATABASE_POOL_MIN_SIZE": "1", "DATABASE_POOL_MAX_SIZE": "2"}


def test_more_open_streams_than_pool_connections(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    postgres_url: str,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(DATABASE_URL=postgres_url, DATABASE_POOL_TIMEOUT_S="3", **POOL)
    runner = launch_runner(server)
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    readers = [StreamReader(server, session_id, until=is_final_idle) for _ in range(8)]
    for reader in readers:
        reader.wait_for(lambda event: event.type == "session.heartbeat", deadline_s=30)
        assert reader.status_code == 200

    with server.client() as client:
        assert client.get(f"/v1/sessions/{session_id}").status_code == 200
    mock_llm.configure([{"text": "Eight watchers, two connections."}])
    accepted = send_message(server, session_id, "hello")
    assert accepted.status_code == 202, accepted.text
    assert wait_turn(server, session_id, accepted.json()["response_id"])["status"] == "completed"
    for reader in readers:
        reader.wait()
        assert "response.completed" in reader.types()
    assert len({tuple(map(str, reader.payloads())) for reader in readers}) == 1


def test_requests_waiting_on_a_runner_leave_the_pool_to_others(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    postgres_url: str,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(
        DATABASE_URL=postgres_url,
        DATABASE_POOL_TIMEOUT_S="2",
        OMNIGENT_RELAY_TIMEOUT_S="6",
        **POOL,
    )
    runner = launch_runner(server)
    assert runner.process is not None
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    mock_llm.configure(
        [{"tool_calls": [{"call_id": "call_w", "name": "get_weather", "arguments": "{}"}]}]
    )
    accepted = send_message(server, session_id, "weather?", tools=[WEATHER_TOOL])
    assert accepted.status_code == 202, accepted.text
    with server.client() as client:
        wait_until(
            lambda: client.get(f"/v1/sessions/{session_id}").json()["status"] == "waiting",
            deadline_s=60,
            what="the turn to park on the client tool",
        )

    # A stopped runner keeps its tunnel open but never acknowledges: each forward
    # waits the whole relay deadline.
    runner.process.popen.send_signal(signal.SIGSTOP)
    try:
        forwarded: list[httpx.Response] = []

        def forward() -> None:
            with server.client() as client:
                forwarded.append(
                    client.post(
                        f"/v1/sessions/{session_id}/events",
                        json={
                            "type": "function_call_output",
                            "data": {"call_id": "call_w", "output": "sunny"},
                        },
                    )
                )

        waiters = [threading.Thread(target=forward) for _ in range(4)]
        for waiter in waiters:
            waiter.start()
        reads = []
        with server.client() as client:
            while any(waiter.is_alive() for waiter in waiters):
                response = client.get(f"/v1/sessions/{session_id}")
                reads.append(response.status_code)
                assert response.status_code == 200, response.text
        for waiter in waiters:
            waiter.join(timeout=30)
    finally:
        runner.process.popen.send_signal(signal.SIGCONT)

    assert len(reads) > 1
    assert [response.status_code for response in forwarded] == [503] * 4
    for response in forwarded:
        error = response.json()["error"]
        assert error["code"] == "runner_unavailable"
        assert "did not acknowledge within 6 s" in error["message"]
