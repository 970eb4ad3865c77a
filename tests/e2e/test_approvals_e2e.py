"""Approvals end to end: real daphne, the real runner program, the mock LLM.

The mock LLM calls a tool and then answers with the tool output it was given
(``tool_then_echo``), so each test asserts what the model saw: the tool's result after
an accept, the refusal after a decline, a deny or an expiry. Answers use the HTTP calls
``omnigent-client``'s ``on_elicitation_request`` hook makes (the SDK itself needs
Python 3.12 and does not install in this environment): the question arrives on the
stream as ``response.elicitation_request``, and the answer is ``POST
…/elicitations/{eid}/resolve`` with ``Origin: omnigent://internal``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer, tool_then_echo
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    bind,
    create_session,
    restart_on_same_port,
    send_message,
    start_runner,
    wait_runner_online,
    wait_turn,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
SDK_HEADERS = {"Origin": "omnigent://internal"}
ALICE = "alice@example.com"
ASK_WRITES = {"name": "ask-writes", "tools": ["sys_os_write"], "action": "ask"}


def guarded_session(
    server: Server,
    runner: Runner,
    make_bundle: Callable[..., bytes],
    *,
    rules: list[dict[str, Any]],
    extra: str = "",
) -> str:
    """A session with these rules of its own, bound to ``runner`` (session.open carries them)."""
    session_id = create_session(server, make_bundle(extra=OS_ENV + extra))
    with server.client() as client:
        response = client.put(f"/v1/sessions/{session_id}/policies", json={"rules": rules})
        assert response.status_code == 200, response.text
    bind(server, session_id, runner.runner_id)
    return session_id


def start_turn(server: Server, session_id: str, text: str) -> str:
    response = send_message(server, session_id, text)
    assert response.status_code == 202, response.text
    return str(response.json()["response_id"])


def pending(server: Server, session_id: str) -> dict[str, Any]:
    """The session's one open question, once the runner has asked it."""
    with server.client() as client:

        def asked() -> dict[str, Any] | None:
            rows = client.get(f"/v1/sessions/{session_id}/elicitations?status=pending").json()
            if rows["data"]:
                return dict(rows["data"][0])
            turns = client.get(f"/v1/sessions/{session_id}/responses").json()["data"]
            ended = [turn for turn in turns if turn["status"] in ("failed", "cancelled")]
            assert not ended, f"the turn ended before asking: {ended}"
            return None

        return dict(wait_until(asked, deadline_s=60, what="the runner to ask"))


def answer(server: Server, session_id: str, eid: str, action: str, **extra: Any) -> None:
    with server.client() as client:
        response = client.post(
            f"/v1/sessions/{session_id}/elicitations/{eid}/resolve",
            json={"action": action, "content": {}, **extra},
            headers=SDK_HEADERS,
        )
    assert response.status_code == 202, response.text
    assert response.json() == {"queued": False}


def elicitation(server: Server, session_id: str, eid: str) -> dict[str, Any]:
    with server.client() as client:
        return dict(client.get(f"/v1/sessions/{session_id}/elicitations/{eid}").json())


def model_saw(turn: dict[str, Any]) -> str:
    """The final assistant text: the mock echoes the tool output it was given."""
    texts = [
        part["text"]
        for item in turn["output"]
        if item["type"] == "message" and item.get("role") == "assistant"
        for part in item["content"]
        if part.get("type") == "output_text"
    ]
    return texts[-1]


# --- the verdicts ---------------------------------------------------------------------------


def test_accept_through_the_sdk_calls_runs_the_tool_and_the_turn_completes(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure(
        tool_then_echo("sys_os_write", {"path": "out.txt", "content": "hello"}, prefix="saw: ")
    )
    session_id = guarded_session(server, runner, make_bundle, rules=[ASK_WRITES])
    stream = StreamReader(server, session_id, until=lambda e: e.type == "response.completed")
    stream.wait_connected()
    response_id = start_turn(server, session_id, "write out.txt")
    # on_elicitation_request: the question arrives on the stream.
    request = stream.wait_for(lambda e: e.type == "response.elicitation_request").data
    assert request["params"]["message"] == ("Agent wants to run sys_os_write: `out.txt`. Approve?")
    assert json.loads(request["params"]["content_preview"]) == {
        "path": "out.txt",
        "content": "hello",
    }
    assert not (runner.workspace / "out.txt").exists()  # parked until the verdict
    with server.client() as client:
        snapshot = client.get(f"/v1/sessions/{session_id}").json()
    assert snapshot["status"] == "running"
    assert snapshot["pending_elicitations"] == [request]

    answer(server, session_id, request["elicitation_id"], "accept")
    turn = wait_turn(server, session_id, response_id)
    assert turn["status"] == "completed", turn
    assert (runner.workspace / "out.txt").read_text() == "hello"
    assert "error" not in model_saw(turn)
    resolved = stream.wait_for(lambda e: e.type == "response.elicitation_resolved").data
    assert resolved == {
        "type": "response.elicitation_resolved",
        "elicitation_id": request["elicitation_id"],
        "action": "accept",
        "resolved_by": ALICE,
    }
    stored = elicitation(server, session_id, request["elicitation_id"])
    assert (stored["status"], stored["resolved_by"]) == ("accepted", ALICE)
    assert stored["arguments"] == {"path": "out.txt", "content": "hello"}


def test_decline_and_deny_leave_the_file_unwritten_and_the_model_sees_why(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    bundle_deny = (
        "guardrails:\n  policies:\n"
        "    - {name: no-secrets, tools: [sys_os_write], when: {path: secret},"
        " action: deny, reason: keep out}\n"
    )
    notes = tool_then_echo("sys_os_write", {"path": "notes.txt", "content": "x"}, call_id="c1")
    secret = tool_then_echo("sys_os_write", {"path": "secret.txt", "content": "x"}, call_id="c2")
    mock_llm.configure(notes, match="take-notes")
    mock_llm.configure(secret, match="keep-secret")
    ask_notes = {**ASK_WRITES, "when": {"path": "^notes"}}
    session_id = guarded_session(server, runner, make_bundle, rules=[ask_notes], extra=bundle_deny)

    first = start_turn(server, session_id, "take-notes please")
    question = pending(server, session_id)
    answer(server, session_id, question["id"], "decline", reason="not now")
    turn = wait_turn(server, session_id, first)
    assert turn["status"] == "completed", turn
    assert json.loads(model_saw(turn)) == {"error": f"declined by {ALICE}: not now"}
    assert not (runner.workspace / "notes.txt").exists()

    stream = StreamReader(server, session_id, until=lambda e: e.type == "response.completed")
    stream.wait_connected()
    second = start_turn(server, session_id, "keep-secret please")
    turn = wait_turn(server, session_id, second)
    assert turn["status"] == "completed", turn
    assert json.loads(model_saw(turn)) == {"error": "denied by policy no-secrets: keep out"}
    assert not (runner.workspace / "secret.txt").exists()
    denied = stream.wait_for(lambda e: e.type == "response.policy_denied").data
    assert denied == {
        "type": "response.policy_denied",
        "conversation_id": session_id,
        "session_id": session_id,
        "response_id": second,
        "call_id": "c2",
        "tool": "sys_os_write",
        "policy_name": "no-secrets",
        "reason": "keep out",
        "phase": "tool_call",
    }


def test_an_unanswered_question_expires_and_the_model_sees_not_approved(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(OMNIGENT_ASK_TIMEOUT_S="1", OMNIGENT_APPROVAL_SWEEP_S="0.2")
    runner = launch_runner(server)
    mock_llm.configure(tool_then_echo("sys_os_write", {"path": "late.txt", "content": "x"}))
    session_id = guarded_session(server, runner, make_bundle, rules=[ASK_WRITES])
    response_id = start_turn(server, session_id, "write late.txt")
    question = pending(server, session_id)
    turn = wait_turn(server, session_id, response_id)
    assert turn["status"] == "completed", turn
    assert json.loads(model_saw(turn)) == {"error": "not approved"}
    assert not (runner.workspace / "late.txt").exists()
    stored = elicitation(server, session_id, question["id"])
    assert (stored["status"], stored["reason"], stored["resolved_by"]) == (
        "expired",
        "unanswered",
        None,
    )
    assert stored["expires_at"] - stored["created_at"] <= 2


# --- durability ------------------------------------------------------------------------------


def test_a_verdict_given_while_the_runner_is_down_applies_when_it_comes_back(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    # A long grace: the open turn must wait for the runner, not fail.
    server = launch_server(OMNIGENT_RECONNECT_GRACE_S="120")
    runner = launch_runner(server)
    arguments = {"path": "a.txt", "content": "A"}
    script = tool_then_echo("sys_os_write", arguments, call_id="c_off")
    # The restarted runner re-runs the turn: the model asks for the same call again.
    mock_llm.configure([script[0], *script])
    session_id = guarded_session(server, runner, make_bundle, rules=[ASK_WRITES])
    response_id = start_turn(server, session_id, "write a.txt")
    question = pending(server, session_id)

    assert runner.process is not None
    runner.process.stop()
    wait_runner_online(server, runner.runner_id, online=False)
    answer(server, session_id, question["id"], "accept")  # stored; the runner is away

    restarted = start_runner(
        server=server,
        token=runner.token,
        runner_id=runner.runner_id,
        workspace=runner.workspace,
        log_dir=tmp_path,
        extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        name="runner-restarted",
    )
    try:
        turn = wait_turn(server, session_id, response_id)
        assert turn["status"] == "completed", turn
        assert (runner.workspace / "a.txt").read_text() == "A"
        with server.client() as client:
            rows = client.get(f"/v1/sessions/{session_id}/elicitations").json()["data"]
        assert [row["status"] for row in rows] == ["accepted"]  # asked once, not twice
    finally:
        assert restarted.process is not None
        restarted.process.stop()


def test_the_server_restarts_while_a_question_is_pending_and_the_tool_runs_once(
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    ask_shell = {"name": "ask-shell", "tools": ["sys_os_shell"], "action": "ask"}
    mock_llm.configure(tool_then_echo("sys_os_shell", {"command": "echo ran >> ran.txt"}))
    session_id = guarded_session(server, runner, make_bundle, rules=[ask_shell])
    response_id = start_turn(server, session_id, "run it")
    question = pending(server, session_id)

    server = restart_on_same_port(server, tmp_path, "daphne-restarted")
    try:
        wait_runner_online(server, runner.runner_id)
        assert pending(server, session_id)["id"] == question["id"]  # survived the restart
        answer(server, session_id, question["id"], "accept")
        turn = wait_turn(server, session_id, response_id)
        assert turn["status"] == "completed", turn
        assert (runner.workspace / "ran.txt").read_text() == "ran\n"  # exactly once
    finally:
        server.process.stop()


@pytest.mark.postgres
@pytest.mark.redis
def test_asked_through_one_process_answered_through_the_other(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server_a, server_b = two_servers
    runner = launch_runner(server_a)  # the tunnel is on A
    mock_llm.configure(tool_then_echo("sys_os_write", {"path": "ab.txt", "content": "AB"}))
    session_id = guarded_session(server_a, runner, make_bundle, rules=[ASK_WRITES])
    response_id = start_turn(server_a, session_id, "write ab.txt")
    question = pending(server_b, session_id)
    answer(server_b, session_id, question["id"], "accept")  # relayed from B to A's tunnel
    turn = wait_turn(server_b, session_id, response_id)
    assert turn["status"] == "completed", turn
    assert (runner.workspace / "ab.txt").read_text() == "AB"
    stored = elicitation(server_a, session_id, question["id"])
    assert (stored["status"], stored["resolved_by"]) == ("accepted", ALICE)
