"""A budget question (usage.md, Budgets): the runner asks before a model call, with no
tool call behind it. The server stores it as an approval like any other and shows it
with ``phase: "budget"``, ``policy_name: "budget"`` and the question's params."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omnigent_runner import protocol
from sessions import approvals
from sessions.approval_shapes import budget_message
from sessions.models import Approval, Session, SessionEvent, Turn

from .conftest import ALICE

pytestmark = pytest.mark.django_db

PARAMS = {
    "kind": "budget",
    "scope": "session",
    "budget_usd": 0.5,
    "spent_usd": 0.52,
    "increment_usd": 0.25,
}


def ask_budget(session_id: str, *, tool: str = "", phase: Any = "budget") -> Approval:
    """The question as the runner's ``approval.requested`` leaves it."""
    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    event = protocol.ApprovalRequested(
        response_id=turn.id,
        call_id="budget_1",
        tool=tool,
        arguments=dict(PARAMS),
        policy_name="budget",
        reason="the session budget is spent: $0.52 of $0.50",
        ask_timeout=600.0,
        phase=phase,
    )
    return approvals.record_requested(session=session, turn=turn, event=event).approval


def test_the_sentence() -> None:
    assert (
        budget_message(PARAMS)
        == "Budget reached: spent $0.52 of $0.50 (the session's budget) — allow $0.25 more?"
    )
    assert (
        budget_message({}) == "Budget reached: spent ? of ? (the session's budget) — allow ? more?"
    )
    odd = {"scope": "user", "budget_usd": True, "spent_usd": -1, "increment_usd": 1e-9}
    assert (
        budget_message(odd)
        == "Budget reached: spent ? of ? (the daily budget) — allow $0.000000001 more?"
    )


def test_a_budget_question_is_shown_with_its_phase_and_params(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    approval = ask_budget(session_id)
    assert (approval.tool, approval.call_id, approval.policy_name) == ("", "budget_1", "budget")
    client = client_for(ALICE)
    (shown,) = client.get(f"/v1/sessions/{session_id}").json()["pending_elicitations"]
    params = dict(shown["params"])
    # PostgreSQL's jsonb keeps the arguments' keys in its own order.
    assert json.loads(params.pop("content_preview")) == PARAMS
    assert params == {
        "mode": "form",
        "message": "Budget reached: spent $0.52 of $0.50 (the session's budget) — allow $0.25 more?",
        "requestedSchema": {},
        "phase": "budget",
        "policy_name": "budget",
        **PARAMS,
    }
    stored = SessionEvent.objects.get(session_id=session_id, type="response.elicitation_request")
    # The same question; on PostgreSQL the snapshot's preview lists the keys in jsonb's order.
    assert json.loads(stored.payload["params"].pop("content_preview")) == PARAMS
    assert {**stored.payload["params"]} == params
    row = client.get(f"/v1/sessions/{session_id}/elicitations/{approval.id}").json()
    assert (row["tool"], row["arguments"], row["policy_name"]) == ("", PARAMS, "budget")
    answered = client.post(
        f"/v1/sessions/{session_id}/elicitations/{approval.id}/resolve",
        {"action": "accept"},
        format="json",
    )
    assert answered.status_code == 202, answered.content
    approval.refresh_from_db()
    assert approval.status == "accepted"


def test_only_the_runners_budget_phase_makes_a_budget_question(client_for, create_session) -> None:
    """A tool call whose arguments merely look like a budget's stays a tool call."""
    session_id = create_session(ALICE)
    approval = ask_budget(session_id, tool="lookup", phase="tool_call")
    (shown,) = client_for(ALICE).get(f"/v1/sessions/{session_id}").json()["pending_elicitations"]
    assert shown["params"]["phase"] == "tool_call"
    assert "kind" not in shown["params"]
    assert approval.message.startswith("Agent wants to run lookup")
