"""Scale-out: two daphne processes on one PostgreSQL database and one Redis.

The runner's tunnel lands on process A; the client talks only to process B. The
relay must cross processes through the channel layer.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    send_message,
    wait_turn,
    wait_until,
)

from .test_tunnel_e2e import WEATHER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(240)]


def test_runner_on_a_client_on_b(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server_a, server_b = two_servers
    runner_id = launch_runner(server_a).runner_id
    for server in (server_a, server_b):
        with server.client() as client:
            assert client.get(f"/v1/runners/{runner_id}/status").json()["online"] is True

    mock_llm.configure(
        [
            {"tool_calls": [{"call_id": "call_ab", "name": "get_weather", "arguments": "{}"}]},
            {"text": "Done across processes."},
        ]
    )
    session_id = create_session(server_b, make_bundle())
    bind(server_b, session_id, runner_id)
    accepted = send_message(server_b, session_id, "cross the processes", tools=[WEATHER_TOOL])
    assert accepted.status_code == 202, accepted.text
    response_id = accepted.json()["response_id"]

    with server_b.client() as client:
        wait_until(
            lambda: client.get(f"/v1/sessions/{session_id}").json()["status"] == "waiting",
            deadline_s=60,
            what="the turn to park on the client tool",
        )
        forwarded = client.post(
            f"/v1/sessions/{session_id}/events",
            json={"type": "function_call_output", "data": {"call_id": "call_ab", "output": "42"}},
        )
        assert forwarded.status_code == 202, forwarded.text
        assert forwarded.json() == {"queued": True, "item_id": "call_ab"}

    turn = wait_turn(server_b, session_id, response_id)
    assert turn["status"] == "completed", turn
    outputs = [
        item
        for item in mock_llm.requests[-1]["body"]["input"]
        if item.get("type") == "function_call_output"
    ]
    assert outputs == [{"type": "function_call_output", "call_id": "call_ab", "output": "42"}]
