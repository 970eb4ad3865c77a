"""The tunnel end to end: real daphne, the real runner program, the mock LLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

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
    start_runner,
    wait_turn,
    wait_until,
)
from tests.tools import WEATHER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_runner_online_bind_and_message_acknowledged(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    with server.client() as client:
        assert client.get(f"/v1/runners/{runner.runner_id}/status").json() == {
            "runner_id": runner.runner_id,
            "online": True,
        }
        listed = client.get("/v1/runners").json()["data"]
        assert [r["runner_id"] for r in listed] == [runner.runner_id]
        assert listed[0]["online"] is True and listed[0]["runner_version"]

    mock_llm.configure([{"text": "Hello from the mock", "stream": True}])
    session_id = create_session(server, make_bundle())
    body = bind(server, session_id, runner.runner_id)
    assert body["runner_id"] == runner.runner_id and body["runner_online"] is True

    response = send_message(server, session_id, "say hello")
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["queued"] is True
    assert accepted["item_id"].startswith("item_") and accepted["response_id"].startswith("resp_")

    turn = wait_turn(server, session_id, accepted["response_id"])
    assert turn["status"] == "completed", turn
    texts = [
        part["text"]
        for item in turn["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    assert texts == ["Hello from the mock"]

    with server.client() as client:
        snapshot = client.get(f"/v1/sessions/{session_id}").json()
    assert snapshot["status"] == "idle"
    assert [item["type"] for item in snapshot["items"]] == ["message", "message"]
    assert snapshot["items"][0]["data"]["content"][0]["text"] == "say hello"
    assert snapshot["items"][0]["created_by"] == "alice@example.com"


def test_function_call_output_is_relayed_to_the_runner(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure(
        [
            {
                "tool_calls": [
                    {"call_id": "call_w1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
                ]
            },
            {"text": "It is sunny in Oslo."},
        ]
    )
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    watcher = StreamReader(server, session_id, until=is_final_idle)
    watcher.wait_for(lambda event: event.type == "session.heartbeat")
    accepted = send_message(server, session_id, "weather?", tools=[WEATHER_TOOL]).json()

    shown = watcher.wait_for(
        lambda event: (
            event.type == "response.output_item.done"
            and event.data["item"]["type"] == "function_call"
        )
    )
    call = shown.data["item"]
    assert call["status"] == "action_required" and call["call_id"] == "call_w1"
    with server.client() as client:
        wait_until(
            lambda: client.get(f"/v1/sessions/{session_id}").json()["status"] == "waiting",
            deadline_s=60,
            what="the session to wait for the client tool",
        )
        # A call waiting for the client is shown, not stored, until it completes.
        items = client.get(f"/v1/sessions/{session_id}/items").json()["data"]
        assert [item["type"] for item in items] == ["message"]

        forwarded = client.post(
            f"/v1/sessions/{session_id}/events",
            json={
                "type": "function_call_output",
                "data": {"call_id": "call_w1", "output": "sunny"},
            },
        )
        assert forwarded.status_code == 202, forwarded.text
        assert forwarded.json() == {"queued": True, "item_id": "call_w1"}

    turn = wait_turn(server, session_id, accepted["response_id"])
    assert turn["status"] == "completed", turn
    watcher.wait()
    stored = [item for item in turn["output"] if item["type"] == "function_call"]
    assert [(item["call_id"], item["status"]) for item in stored] == [("call_w1", "completed")], (
        turn["output"]
    )
    second_request = mock_llm.requests[-1]["body"]
    outputs = [
        item for item in second_request["input"] if item.get("type") == "function_call_output"
    ]
    assert outputs == [{"type": "function_call_output", "call_id": "call_w1", "output": "sunny"}]
    assert json.loads(call["arguments"]) == {"city": "Oslo"}


def test_message_without_a_runner_is_503_and_stores_nothing(
    server: Server, make_bundle: Callable[..., bytes]
) -> None:
    session_id = create_session(server, make_bundle())
    response = send_message(server, session_id, "hello?")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "runner_unavailable"
    with server.client() as client:
        assert client.get(f"/v1/sessions/{session_id}/items").json()["data"] == []
        assert client.get(f"/v1/sessions/{session_id}/responses").json()["data"] == []


def test_rebinding_to_a_restarted_runner_keeps_event_numbering(
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    """A runner that restarts while unbound numbers the session's events from 1 again;
    ``session.open`` tells it where the server is, so nothing is taken for a duplicate."""
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    first = send_message(server, session_id, "first").json()
    assert wait_turn(server, session_id, first["response_id"])["status"] == "completed"

    with server.client() as client:
        assert client.patch(f"/v1/sessions/{session_id}", json={"runner_id": ""}).status_code == 200
    assert runner.process is not None
    runner.process.stop()
    restarted = start_runner(
        server=server,
        token=runner.token,
        runner_id=runner.runner_id,
        workspace=runner.workspace,
        log_dir=tmp_path,
        extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        name="runner-restarted",
    )
    runner.process = restarted.process
    bind(server, session_id, runner.runner_id)
    second = send_message(server, session_id, "second").json()
    turn = wait_turn(server, session_id, second["response_id"])
    assert turn["status"] == "completed"
    assert [item["type"] for item in turn["output"]] == ["message"]
