"""Requests for the approval and policy endpoints, for ``test_schema_conformance``.

Each status the schema documents for these operations is produced here once (and the
``approval`` event's 409 on ``POST .../events``); the conformance test checks every
response against the schema, the snapshot and list rows with an open question included.
"""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from omnigent_runner import protocol
from sessions import approvals
from sessions.models import Session, Turn

SESSION = "/v1/sessions/{session_id}"
ELICITATIONS = SESSION + "/elicitations"
ELICITATION = ELICITATIONS + "/{elicitation_id}"
RESOLVE = ELICITATION + "/resolve"
POLICIES = SESSION + "/policies"
EVENTS = SESSION + "/events"


def _ask(session_id: str, call_id: str) -> str:
    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    event = protocol.ApprovalRequested(
        response_id=turn.id,
        call_id=call_id,
        tool="sys_os_shell",
        arguments={"command": "make clean"},
        policy_name="ask-shell",
        reason="",
        ask_timeout=600,
    )
    return approvals.record_requested(session=session, turn=turn, event=event).approval.id


def exercise_approvals(alice: Any, bob: Any, anon: Any, session_id: str) -> None:
    """``bob`` holds read access on ``session_id``; ``anon`` has no identity."""
    open_one = _ask(session_id, "call_open")
    answered = _ask(session_id, "call_answered")
    ids = {"session_id": session_id}
    one = {**ids, "elicitation_id": answered}
    unknown = {**ids, "elicitation_id": "elicit_unknown"}
    rule = {"name": "ask-shell", "tools": ["sys_os_shell"], "when": {"command": "rm"}}
    statuses = [
        # The snapshot and the list with an open question.
        alice("get", SESSION, **ids),
        alice("get", "/v1/sessions"),
        # Answering.
        alice("post", RESOLVE, {"action": "accept", "reason": "fine"}, **one),
        alice("post", RESOLVE, {"action": "accept"}, **one),
        alice("post", RESOLVE, {"action": "decline"}, **one),
        alice("post", RESOLVE, {"action": "perhaps"}, **one),
        alice("post", RESOLVE, "x", content_type="text/plain", **one),
        bob("post", RESOLVE, {"action": "accept"}, **one),
        alice("post", RESOLVE, {"action": "accept"}, **unknown),
        anon("post", RESOLVE, {"action": "accept"}, **one),
        alice(
            "post",
            EVENTS,
            {"type": "approval", "data": {"elicitation_id": answered, "action": "cancel"}},
            **ids,
        ),
        # Reading.
        bob("get", ELICITATIONS, **ids),
        alice("get", ELICITATIONS, query="?status=pending&limit=1", **ids),
        alice("get", ELICITATIONS, query="?status=open", **ids),
        alice("get", ELICITATIONS, session_id="conv_unknown"),
        anon("get", ELICITATIONS, **ids),
        bob("get", ELICITATION, **one),
        alice("get", ELICITATION, session_id=session_id, elicitation_id=open_one),
        alice("get", ELICITATION, **unknown),
        anon("get", ELICITATION, **one),
        # Policies.
        alice("put", POLICIES, {"rules": [{**rule, "action": "ask", "reason": "r"}]}, **ids),
        alice("put", POLICIES, {"rules": [{**rule, "action": "perhaps"}]}, **ids),
        alice("put", POLICIES, "x", content_type="text/plain", **ids),
        bob("put", POLICIES, {"rules": []}, **ids),
        alice("put", POLICIES, {"rules": []}, session_id="conv_unknown"),
        anon("put", POLICIES, {"rules": []}, **ids),
        bob("get", POLICIES, **ids),
        alice("get", POLICIES, session_id="conv_unknown"),
        anon("get", POLICIES, **ids),
    ]
    assert [r.status_code for r in statuses] == [
        *[200, 200],
        *[202, 202, 409, 400, 415, 403, 404, 401, 409],
        *[200, 200, 400, 404, 401, 200, 200, 404, 401],
        *[200, 400, 415, 403, 404, 401, 200, 404, 401],
    ]
    assert statuses[0].json()["pending_elicitations"], "the snapshot lists the open question"
    padding = "x" * 4096
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        large = [
            alice("post", RESOLVE, {"action": "accept", "reason": padding}, **one),
            alice("put", POLICIES, {"rules": [{**rule, "name": padding}]}, **ids),
        ]
    assert [r.status_code for r in large] == [413, 413]
