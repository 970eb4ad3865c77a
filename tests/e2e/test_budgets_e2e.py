"""Budgets end to end (usage.md, Budgets): real daphne, the real runner program, the mock
LLM reporting usage and a price file, so every call costs something.

The runner checks the budgets before every model call; a spent budget with ``ask``
becomes a question on the approvals endpoints (``phase: "budget"``), and the mock's
captured requests show which model calls were made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, wait_turn, wait_until
from tests.e2e.test_approvals_e2e import answer, guarded_session, pending, start_turn

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
WRITE_NOTE = {
    "call_id": "call_note",
    "name": "sys_os_write",
    "arguments": json.dumps({"path": "note.txt", "content": "noted\n"}),
}
# With the conftest's PRICES: 900 micro-dollars for the first call.
FIRST = {"input_tokens": 1000, "cached_tokens": 400, "output_tokens": 50}
SECOND = {"input_tokens": 1500, "cached_tokens": 1000, "output_tokens": 100}
TOOL_TURN = [{"tool_calls": [WRITE_NOTE], "usage": FIRST}, {"text": "Written.", "usage": SECOND}]
# Nothing may be spent, and an accepted question allows a dollar more.
ASK_FROM_ZERO = "guardrails:\n  budget_usd: 0\n  on_budget: ask\n  ask_increment_usd: 1\n"


def budget_session(server: Server, runner: Runner, bundle: bytes) -> str:
    session_id = create_session(server, bundle)
    bind(server, session_id, runner.runner_id)
    return session_id


def turn_of(server: Server, session_id: str, response_id: str) -> dict[str, Any]:
    return wait_turn(server, session_id, response_id, deadline_s=90)


def test_ask_shows_a_budget_question_and_accept_completes_the_turn(
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = priced_server
    mock_llm.configure(TOOL_TURN)
    session_id = budget_session(server, priced_runner, make_bundle(extra=OS_ENV + ASK_FROM_ZERO))
    response_id = start_turn(server, session_id, "write a note")

    question = pending(server, session_id)
    assert (question["tool"], question["policy_name"], question["call_id"]) == (
        "",
        "budget",
        "budget_1",
    )
    params = {
        "kind": "budget",
        "scope": "session",
        "budget_usd": 0.0,
        "spent_usd": 0.0,
        "increment_usd": 1.0,
    }
    assert question["arguments"] == params
    assert (
        question["message"]
        == "Budget reached: spent $0.00 of $0.00 (the session's budget) — allow $1.00 more?"
    )
    with server.client() as client:
        snapshot = client.get(f"/v1/sessions/{session_id}").json()
    (card,) = snapshot["pending_elicitations"]
    assert card["params"]["phase"] == "budget"
    assert {key: card["params"][key] for key in params} == params
    assert mock_llm.requests == []  # the model waits for the answer

    answer(server, session_id, question["id"], "accept")
    turn = turn_of(server, session_id, response_id)
    assert turn["status"] == "completed", turn
    # One question: the accepted dollar covers the second call too.
    assert len(mock_llm.requests) == 2
    assert turn["usage"]["cost_usd"] > 0
    with server.client() as client:
        rows = client.get(f"/v1/sessions/{session_id}/elicitations").json()["data"]
    assert [(row["call_id"], row["status"]) for row in rows] == [("budget_1", "accepted")]


def test_decline_fails_the_turn_before_the_model_is_called(
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = priced_server
    mock_llm.configure(TOOL_TURN)
    session_id = budget_session(server, priced_runner, make_bundle(extra=OS_ENV + ASK_FROM_ZERO))
    response_id = start_turn(server, session_id, "write a note")
    question = pending(server, session_id)
    answer(server, session_id, question["id"], "decline", reason="too dear")
    turn = turn_of(server, session_id, response_id)
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "budget_exceeded"
    assert "raising it was declined" in turn["error"]["message"]
    assert mock_llm.requests == []


def test_deny_the_call_that_crosses_the_budget_is_the_last(
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    workspace: Any,
) -> None:
    """A tenth of a thousandth of a dollar: the first call (900 micro-dollars) crosses
    it, so the second model call of the tool-using turn never starts. The tool waits for
    a person (an ``ask`` rule) until the first call is counted, so the server's update
    reaches the runner before the verdict does (one tunnel, in order)."""
    server = priced_server
    mock_llm.configure(TOOL_TURN)
    ask_write = {"name": "ask-writes", "tools": ["sys_os_write"], "action": "ask"}
    guardrails = "guardrails:\n  budget_usd: 0.0001\n  on_budget: deny\n"
    session_id = guarded_session(
        server, priced_runner, make_bundle, rules=[ask_write], extra=guardrails
    )
    response_id = start_turn(server, session_id, "write a note")
    question = pending(server, session_id)
    assert question["tool"] == "sys_os_write"

    def counted() -> bool:
        with server.client() as client:
            snapshot = client.get(f"/v1/sessions/{session_id}").json()
        return bool(snapshot["total_cost_usd"])

    wait_until(counted, deadline_s=30, what="the first call to be priced")
    answer(server, session_id, question["id"], "accept")
    turn = turn_of(server, session_id, response_id)
    assert (workspace / "note.txt").read_text() == "noted\n"  # the tool ran
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "budget_exceeded"
    assert turn["error"]["message"].startswith("the session budget is spent: $0.0009 of $0.0001")
    assert len(mock_llm.requests) == 1
