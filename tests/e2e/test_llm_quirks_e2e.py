"""Behaviours of real OpenAI-compatible servers (issue 44), end to end: real daphne, the
real runner program and the mock LLM with one quirk switched on per case.

Each quirk is what llama-cpp-python's server did to the runner: a 500 for an assistant
message with ``content: null``, errors reported as an empty 200 stream, tools ignored
without ``tool_choice``, no ``/v1/responses``, and a connection dropped mid-answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner.llm import CONNECTION_BROKE, STREAM_ENDED_EARLY
from testing.mockllm import NO_TOOLS_TEXT, MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message, wait_turn

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
CHAT = "  api: chat_completions\n"
WRITE_NOTE = {
    "call_id": "call_note",
    "name": "sys_os_write",
    "arguments": json.dumps({"path": "note.txt", "content": "noted\n"}),
}
STORY = "The ancient dragon, known for its majestic size and fire, slept under the hill."


def start(server: Server, runner: Runner, bundle: bytes) -> str:
    session_id = create_session(server, bundle)
    bind(server, session_id, runner.runner_id)
    return session_id


def run_turn(server: Server, session_id: str, text: str) -> dict[str, Any]:
    response = send_message(server, session_id, text)
    assert response.status_code == 202, response.text
    return wait_turn(server, session_id, response.json()["response_id"])


def items(server: Server, session_id: str) -> list[dict[str, Any]]:
    with server.client("alice@example.com") as client:
        response = client.get(f"/v1/sessions/{session_id}/items?limit=1000")
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def session(server: Server, session_id: str) -> dict[str, Any]:
    with server.client("alice@example.com") as client:
        return dict(client.get(f"/v1/sessions/{session_id}").json())


def assistant_texts(server: Server, session_id: str) -> list[tuple[str, str]]:
    """(status, text) of the stored assistant messages."""
    return [
        (item["status"], "".join(part.get("text", "") for part in item["content"]))
        for item in items(server, session_id)
        if item["type"] == "message" and item.get("role") == "assistant"
    ]


def test_a_tool_call_keeps_the_chat_session_usable(
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    workspace: Path,
) -> None:
    """Item 1: the history after a tool call is accepted by a server that rejects a
    null ``content``, in that turn and the next."""
    mock_llm.set_quirks(reject_null_content=True)
    mock_llm.configure([{"tool_calls": [WRITE_NOTE]}, {"text": "Written."}, {"text": "Hello."}])
    session_id = start(server, runner, make_bundle(extra=CHAT + OS_ENV))
    first = run_turn(server, session_id, "write a note")
    assert first["status"] == "completed", first
    assert (workspace / "note.txt").read_text() == "noted\n"
    second = run_turn(server, session_id, "and now?")
    assert second["status"] == "completed", second
    assert assistant_texts(server, session_id) == [
        ("completed", "Written."),
        ("completed", "Hello."),
    ]
    last = mock_llm.requests[-1]["body"]["messages"]
    calls = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    assert [m["content"] for m in calls] == [""]


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_empty_stream_fails_the_turn(
    api: str,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """Item 2: a 200 stream that ends with no data is a failed turn, never an empty
    answer; on Chat Completions the server's own error (asked unstreamed) is shown."""
    mock_llm.set_quirks(empty_stream=True)
    too_long = "This model's maximum context length is 2048 tokens (context_length_exceeded)"
    mock_llm.configure([{"error": {"status_code": 400, "message": too_long}}])
    session_id = start(server, runner, make_bundle(extra=f"  api: {api}\n"))
    turn = run_turn(server, session_id, "a very long prompt")
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "llm_error"
    message = turn["error"]["message"]
    assert message.startswith(STREAM_ENDED_EARLY), message
    if api == "chat_completions":
        assert too_long in message and "HTTP 400" in message, message
        assert [r["body"].get("stream") for r in mock_llm.requests] == [True, None]
        assert mock_llm.requests[1]["body"]["max_tokens"] == 1
    assert session(server, session_id)["status"] == "failed"
    assert assistant_texts(server, session_id) == []


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_a_forced_tool_choice_reaches_a_server_that_needs_it(
    api: str,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    workspace: Path,
) -> None:
    """Item 3: ``executor.tool_choice`` is sent as the API spells it, once per turn:
    the follow-up after the tool's output leaves it out, so the model can answer."""
    mock_llm.set_quirks(tool_choice_required=True)
    # Without tool_choice the server ignores the tools (the quirk): no file.
    mock_llm.configure([{"tool_calls": [WRITE_NOTE]}])
    plain = start(server, runner, make_bundle(extra=f"  api: {api}\n" + OS_ENV))
    assert run_turn(server, plain, "write a note")["status"] == "completed"
    assert assistant_texts(server, plain) == [("completed", NO_TOOLS_TEXT)]
    assert not (workspace / "note.txt").exists()

    mock_llm.reset()
    mock_llm.set_quirks(tool_choice_required=True)
    mock_llm.configure([{"tool_calls": [WRITE_NOTE]}, {"tool_calls": [WRITE_NOTE]}])
    extra = f"  api: {api}\n  tool_choice: sys_os_write\n" + OS_ENV
    forced = start(server, runner, make_bundle(extra=extra))
    turn = run_turn(server, forced, "write a note")
    assert turn["status"] == "completed", turn
    assert (workspace / "note.txt").read_text() == "noted\n"
    sent = [r["body"].get("tool_choice") for r in mock_llm.requests]
    if api == "chat_completions":
        named = {"type": "function", "function": {"name": "sys_os_write"}}
    else:
        named = {"type": "function", "name": "sys_os_write"}
    # The second scripted call is dropped by the quirk: the follow-up had no tool_choice.
    assert sent == [named, None]
    assert assistant_texts(server, forced) == [("completed", NO_TOOLS_TEXT)]


def test_tool_choice_is_checked(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    """A bad ``tool_choice`` is refused at upload; a client tool's name the message does
    not bring fails the turn with a message naming it."""
    with server.client("alice@example.com") as client:
        response = client.post(
            "/v1/sessions",
            files={"bundle": ("a.tar.gz", make_bundle(extra="  tool_choice: sys_os_write\n"))},
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    assert "no os_env" in response.json()["error"]["message"]

    session_id = start(server, runner, make_bundle(extra="  tool_choice: get_weather\n" + OS_ENV))
    turn = run_turn(server, session_id, "weather?")
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "agent_load_failed"
    assert "'get_weather'" in turn["error"]["message"]
    assert mock_llm.requests == []


def test_a_server_without_the_responses_api_is_named(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    """Item 4: the 404 names the URL and the fix; the same agent on Chat works."""
    mock_llm.set_quirks(no_responses=True)
    session_id = start(server, runner, make_bundle())
    turn = run_turn(server, session_id, "hello")
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "llm_error"
    message = turn["error"]["message"]
    assert f"HTTP 404 for {mock_llm.base_url}/responses" in message, message
    assert "`executor.api: chat_completions`" in message, message

    chat = start(server, runner, make_bundle(extra=CHAT))
    assert run_turn(server, chat, "hello")["status"] == "completed"


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_a_connection_cut_mid_answer_keeps_what_was_streamed(
    api: str,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """Item 5: the turn fails ``connection_error`` saying the connection broke (not
    "cannot reach"), and the text already streamed is stored ``incomplete``; the next
    turn works and its model sees that text."""
    mock_llm.set_quirks(cut_mid_stream=True)
    mock_llm.configure([{"text": STORY, "stream": True}])
    session_id = start(server, runner, make_bundle(extra=f"  api: {api}\n"))
    turn = run_turn(server, session_id, "tell me a story")
    assert turn["status"] == "failed", turn
    assert turn["error"] == {"code": "connection_error", "message": CONNECTION_BROKE}
    [(status, text)] = assistant_texts(server, session_id)
    assert status == "incomplete"
    assert text and STORY.startswith(text) and text != STORY, text

    mock_llm.set_quirks(cut_mid_stream=False)
    mock_llm.configure([{"text": "The end."}])
    assert run_turn(server, session_id, "go on")["status"] == "completed"
    assert text in json.dumps(mock_llm.requests[-1]["body"], ensure_ascii=False)
