"""Approvals through the HTTP API (approvals.md): the snapshot and list rows, answering
(resolve and the ``approval`` event) with every status, the reads, expiry by the stored
deadline and the interrupt. No runner is bound here, so every verdict stays stored and
unrelayed (the relay is in ``tests/consumers/test_approvals_relay.py``)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote as admin_quote
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from omnigent_runner import protocol
from sessions import approvals
from sessions.approval_shapes import approval_message, content_preview
from sessions.models import Approval, Session, SessionEvent, Turn

from .conftest import ALICE, BOB, CAROL, assert_error

pytestmark = pytest.mark.django_db

ELICITATION_KEYS = [
    "id",
    "object",
    "status",
    "tool",
    "arguments",
    "policy_name",
    "message",
    "response_id",
    "call_id",
    "created_at",
    "expires_at",
    "resolved_at",
    "resolved_by",
    "reason",
]


def ask(
    session_id: str,
    *,
    call_id: str = "call_1",
    tool: str = "sys_os_shell",
    arguments: dict[str, Any] | None = None,
    ask_timeout: float = 600.0,
    turn: Turn | None = None,
) -> Approval:
    """A question as the runner's ``approval.requested`` leaves it (the service it calls)."""
    session = Session.objects.get(pk=session_id)
    turn = turn or Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    event = protocol.ApprovalRequested(
        response_id=turn.id,
        call_id=call_id,
        tool=tool,
        arguments={"command": "rm -rf build"} if arguments is None else arguments,
        policy_name="ask-shell",
        reason="shell needs a yes",
        ask_timeout=ask_timeout,
    )
    return approvals.record_requested(session=session, turn=turn, event=event).approval


def events_of(session_id: str, kind: str) -> list[dict[str, Any]]:
    return [
        event.payload
        for event in SessionEvent.objects.filter(session_id=session_id, type=kind).order_by("seq")
    ]


def resolve(client: Any, session_id: str, eid: str, body: Any) -> Any:
    return client.post(f"/v1/sessions/{session_id}/elicitations/{eid}/resolve", body, format="json")


def answer_event(client: Any, session_id: str, data: Any) -> Any:
    return client.post(
        f"/v1/sessions/{session_id}/events", {"type": "approval", "data": data}, format="json"
    )


# --- what a person sees -------------------------------------------------------------------


def test_the_question_sentence_and_preview() -> None:
    assert (
        approval_message("sys_os_shell", {"command": "rm -rf build"})
        == "Agent wants to run sys_os_shell: `rm -rf build`. Approve?"
    )
    assert approval_message("sys_os_write", {"path": "docs/a.md", "content": "x"}) == (
        "Agent wants to run sys_os_write: `docs/a.md`. Approve?"
    )
    assert (
        approval_message("lookup", {"city": "Oslo"})
        == "Agent wants to run lookup: `Oslo`. Approve?"
    )
    assert approval_message("ping", {}) == "Agent wants to run ping. Approve?"
    long = approval_message("sys_os_shell", {"command": "echo " + "y" * 500})
    assert len(long) < 260 and long.endswith("…`. Approve?")
    multi = approval_message("sys_os_shell", {"command": "a\n  b`c"})
    assert multi == "Agent wants to run sys_os_shell: `a b'c`. Approve?"
    big = {"content": "z" * 5000}
    assert content_preview(big) == json.dumps(big, separators=(", ", ": "))[:1024]
    assert len(content_preview(big)) == 1024
    # The same text whatever order the keys come back in (jsonb orders them its way).
    assert content_preview({"path": "a", "content": "b"}) == '{"content": "b", "path": "a"}'
    assert content_preview({"content": "b", "path": "a"}) == '{"content": "b", "path": "a"}'


def test_a_question_is_in_the_snapshot_and_the_stream_log(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    first = ask(session_id, call_id="call_1")
    second = ask(session_id, call_id="call_2", arguments={"path": "a.txt", "content": "hi"})
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}").json()
    assert body["pending_elicitations_count"] == 2
    expected_first = {
        "type": "response.elicitation_request",
        "elicitation_id": first.id,
        "session_id": session_id,
        "response_id": first.response_id,
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Agent wants to run sys_os_shell: `rm -rf build`. Approve?",
            "requestedSchema": {},
            "phase": "tool_call",
            "policy_name": "ask-shell",
            "content_preview": '{"command": "rm -rf build"}',
        },
    }
    assert body["pending_elicitations"][0] == expected_first
    assert [p["elicitation_id"] for p in body["pending_elicitations"]] == [first.id, second.id]
    # The stream shows exactly the payload the snapshot lists.
    assert events_of(session_id, "response.elicitation_request") == body["pending_elicitations"]
    assert first.id.startswith("elicit_") and len(first.id) == len("elicit_") + 32


def test_asked_twice_for_the_same_call_is_one_question(create_session) -> None:
    session_id = create_session(ALICE)
    first = ask(session_id)
    again = ask(session_id, turn=Turn.objects.get(session_id=session_id, id=first.response_id))
    assert again.id == first.id
    assert Approval.objects.count() == 1
    assert len(events_of(session_id, "response.elicitation_request")) == 1


def test_the_deadline_is_the_asked_timeout_capped_by_the_server(create_session) -> None:
    session_id = create_session(ALICE)
    before = timezone.now()
    short = ask(session_id, call_id="a", ask_timeout=30)
    assert timedelta(seconds=29) < short.expires_at - before < timedelta(seconds=31)
    with override_settings(OMNIGENT_ASK_TIMEOUT_S=60):
        capped = ask(session_id, call_id="b", ask_timeout=7 * 24 * 3600)
    assert timedelta(seconds=59) < capped.expires_at - before < timedelta(seconds=61)


def test_list_rows_count_open_questions_without_a_query_per_row(client_for, create_session) -> None:
    ids = [create_session(ALICE, title=f"s{n}") for n in range(3)]
    ask(ids[0], call_id="a")
    ask(ids[0], call_id="b")
    answered = ask(ids[1], call_id="c")
    approvals.resolve(session_id=ids[1], approval_id=answered.id, action="accept", user=None)
    client = client_for(ALICE)
    client.get("/v1/sessions")  # warm up the user row
    with CaptureQueriesContext(connection) as three:
        rows = client.get("/v1/sessions").json()["data"]
    assert {row["id"]: row["pending_elicitations_count"] for row in rows} == {
        ids[0]: 2,
        ids[1]: 0,
        ids[2]: 0,
    }
    with CaptureQueriesContext(connection) as one:
        client.get("/v1/sessions?limit=1")
    assert len(three.captured_queries) == len(one.captured_queries)


# --- answering ------------------------------------------------------------------------------


def test_resolve_stores_the_verdict_and_publishes_it(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    response = resolve(client_for(ALICE), session_id, approval.id, {"action": "accept"})
    assert response.status_code == 202, response.content
    assert response.json() == {"queued": False}
    approval.refresh_from_db()
    assert approval.status == "accepted"
    assert approval.resolved_by.username == ALICE
    assert approval.resolved_at is not None
    assert approval.runner_acked is False  # no runner took it yet: session.open carries it
    assert events_of(session_id, "response.elicitation_resolved") == [
        {
            "type": "response.elicitation_resolved",
            "elicitation_id": approval.id,
            "action": "accept",
            "resolved_by": ALICE,
        }
    ]
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}").json()
    assert body["pending_elicitations"] == [] and body["pending_elicitations_count"] == 0


def test_the_same_action_again_is_idempotent_and_another_is_a_conflict(
    client_for, create_session
) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    client = client_for(ALICE)
    body = {"action": "decline", "reason": "not now"}
    assert resolve(client, session_id, approval.id, body).status_code == 202
    again = resolve(client, session_id, approval.id, {"action": "decline", "reason": "other"})
    assert again.status_code == 202 and again.json() == {"queued": False}
    assert_error(resolve(client, session_id, approval.id, {"action": "accept"}), 409, "conflict")
    assert_error(
        answer_event(client, session_id, {"elicitation_id": approval.id, "action": "cancel"}),
        409,
        "conflict",
    )
    approval.refresh_from_db()
    assert (approval.status, approval.reason) == ("declined", "not now")  # the first stands
    resolved = events_of(session_id, "response.elicitation_resolved")
    assert resolved == [
        {
            "type": "response.elicitation_resolved",
            "elicitation_id": approval.id,
            "action": "decline",
            "reason": "not now",
            "resolved_by": ALICE,
        }
    ]


def test_the_approval_event_answers_the_same_way(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    client = client_for(ALICE)
    data = {"elicitation_id": approval.id, "action": "cancel", "content": {}, "reason": "later"}
    response = answer_event(client, session_id, data)
    assert response.status_code == 202 and response.json() == {"queued": False}
    assert answer_event(client, session_id, data).status_code == 202
    approval.refresh_from_db()
    assert (approval.status, approval.reason, approval.resolved_by.username) == (
        "cancelled",
        "later",
        ALICE,
    )


@pytest.mark.parametrize(
    "body",
    [
        {"action": "approve"},
        {"action": 1},
        {},
        {"action": "accept", "reason": 5},
        {"action": "accept", "content": "x"},
        {"action": "accept", "reason": "\u0000"},
    ],
)
def test_a_bad_answer_is_400_and_changes_nothing(client_for, create_session, body) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    assert_error(resolve(client_for(ALICE), session_id, approval.id, body), 400, "invalid_input")
    assert_error(
        answer_event(client_for(ALICE), session_id, {"elicitation_id": approval.id, **body}),
        400,
        "invalid_input",
    )
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_bad_action_is_400_before_an_unknown_id_is_404(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    error = assert_error(
        resolve(client_for(ALICE), session_id, "elicit_nope", {"action": "maybe"}),
        400,
        "invalid_input",
    )
    assert "action" in error["fields"]
    assert_error(
        answer_event(client_for(ALICE), session_id, {"action": "accept"}), 400, "invalid_input"
    )


def test_unknown_or_another_sessions_elicitation_is_404(client_for, create_session) -> None:
    mine, other = create_session(ALICE), create_session(ALICE)
    theirs = ask(other)
    client = client_for(ALICE)
    for eid in ("elicit_unknown", theirs.id):
        assert_error(resolve(client, mine, eid, {"action": "accept"}), 404, "not_found")
        assert_error(
            answer_event(client, mine, {"elicitation_id": eid, "action": "accept"}),
            404,
            "not_found",
        )
        assert_error(client.get(f"/v1/sessions/{mine}/elicitations/{eid}"), 404, "not_found")
    theirs.refresh_from_db()
    assert theirs.status == "pending"


def test_permissions_read_only_403_stranger_404_edit_answers(
    client_for, create_session, grant
) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    grant(session_id, BOB, 1)
    grant(session_id, CAROL, 2)
    answer = {"action": "accept"}
    assert_error(resolve(client_for(BOB), session_id, approval.id, answer), 403, "forbidden")
    assert_error(
        answer_event(client_for(BOB), session_id, {"elicitation_id": approval.id, **answer}),
        403,
        "forbidden",
    )
    stranger = client_for("mallory@example.com")
    assert_error(resolve(stranger, session_id, approval.id, answer), 404, "not_found")
    assert_error(stranger.get(f"/v1/sessions/{session_id}/elicitations"), 404, "not_found")
    # The permission check comes first: a read-only caller's bad action is still a 403.
    assert_error(
        resolve(client_for(BOB), session_id, approval.id, {"action": "x"}), 403, "forbidden"
    )
    assert client_for(BOB).get(f"/v1/sessions/{session_id}/elicitations").status_code == 200
    assert resolve(client_for(CAROL), session_id, approval.id, answer).status_code == 202
    approval.refresh_from_db()
    assert approval.resolved_by.username == CAROL


# --- expiry and interrupt -------------------------------------------------------------------


def test_a_question_past_its_deadline_is_expired_not_answered(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client = client_for(ALICE)
    assert_error(resolve(client, session_id, approval.id, {"action": "accept"}), 409, "conflict")
    approval.refresh_from_db()
    assert (approval.status, approval.reason, approval.resolved_by) == (
        "expired",
        "unanswered",
        None,
    )
    assert events_of(session_id, "response.elicitation_resolved") == [
        {
            "type": "response.elicitation_resolved",
            "elicitation_id": approval.id,
            "action": "cancel",
            "reason": "unanswered",
        }
    ]
    # An expired question's verdict is a cancel: cancelling again is idempotent.
    assert resolve(client, session_id, approval.id, {"action": "cancel"}).status_code == 202
    assert len(events_of(session_id, "response.elicitation_resolved")) == 1


def test_expire_due_expires_each_question_once(create_session) -> None:
    session_id = create_session(ALICE)
    due = ask(session_id, call_id="due")
    later = ask(session_id, call_id="later")
    Approval.objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert [a.id for a in approvals.expire_due()] == [due.id]
    assert approvals.expire_due() == []
    assert Approval.objects.get(pk=later.pk).status == "pending"
    assert Approval.objects.get(pk=due.pk).status == "expired"


def test_an_interrupt_cancels_the_open_questions(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)
    response = client_for(ALICE).post(
        f"/v1/sessions/{session_id}/events", {"type": "interrupt"}, format="json"
    )
    assert response.status_code == 202
    approval.refresh_from_db()
    assert (approval.status, approval.reason, approval.resolved_by.username) == (
        "cancelled",
        "interrupted",
        ALICE,
    )
    assert events_of(session_id, "response.elicitation_resolved")[0]["action"] == "cancel"


def test_a_finished_turn_cancels_its_open_questions(create_session) -> None:
    from runners import runner_events

    session_id = create_session(ALICE)
    approval = ask(session_id)
    runner_events.fail_turn(
        session_id=session_id, response_id=approval.response_id, code="x", message="gone"
    )
    approval.refresh_from_db()
    assert (approval.status, approval.reason) == ("cancelled", "the turn ended")


# --- reading --------------------------------------------------------------------------------


def test_reading_approvals_lists_filters_and_pages(client_for, create_session, grant) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    first = ask(session_id, call_id="a")
    second = ask(session_id, call_id="b")
    third = ask(session_id, call_id="c")
    approvals.resolve(
        session_id=session_id, approval_id=second.id, action="decline", user=None, reason="no"
    )
    client = client_for(BOB)
    base = f"/v1/sessions/{session_id}/elicitations"
    everything = client.get(base).json()
    assert [row["id"] for row in everything["data"]] == [first.id, second.id, third.id]
    assert everything["object"] == "list" and everything["has_more"] is False
    assert [row["id"] for row in client.get(base + "?status=pending").json()["data"]] == [
        first.id,
        third.id,
    ]
    resolved = client.get(base + "?status=resolved").json()["data"]
    assert [row["id"] for row in resolved] == [second.id]
    page = client.get(base + "?limit=1").json()
    assert [row["id"] for row in page["data"]] == [first.id] and page["has_more"] is True
    after = client.get(base + f"?limit=5&after={first.id}").json()
    assert [row["id"] for row in after["data"]] == [second.id, third.id]
    assert_error(client.get(base + "?status=open"), 400, "invalid_input")

    detail = client.get(f"{base}/{second.id}").json()
    assert list(detail) == ELICITATION_KEYS
    assert detail == {
        "id": second.id,
        "object": "session.elicitation",
        "status": "declined",
        "tool": "sys_os_shell",
        "arguments": {"command": "rm -rf build"},
        "policy_name": "ask-shell",
        "message": "Agent wants to run sys_os_shell: `rm -rf build`. Approve?",
        "response_id": second.response_id,
        "call_id": "b",
        "created_at": int(second.created_at.timestamp()),
        "expires_at": int(second.expires_at.timestamp()),
        "resolved_at": detail["resolved_at"],
        "resolved_by": None,
        "reason": "no",
    }
    assert isinstance(detail["resolved_at"], int)


def test_every_server_process_sweeps_expired_questions() -> None:
    from omnigent_site.runtime import background

    assert "runners.verdicts.sweep_expired_approvals_forever" in background.registered()


# --- the admin ------------------------------------------------------------------------------


@pytest.fixture
def admin_client(django_user_model) -> Any:
    from rest_framework.test import APIClient

    admin = django_user_model.objects.create_superuser(
        username="root@example.com", email="root@example.com", password="pw-for-admin"
    )
    client = APIClient()
    client.force_login(admin)
    return client


def test_the_admin_lists_approvals_with_filters_and_resolves_them(
    admin_client, create_session
) -> None:
    session_id = create_session(ALICE)
    shell = ask(session_id, call_id="a")
    write = ask(session_id, call_id="b", tool="sys_os_write", arguments={"path": "x"})
    listing = admin_client.get("/admin/agent_sessions/approval/?status__exact=pending")
    assert listing.status_code == 200
    assert shell.id.encode() in listing.content and write.id.encode() in listing.content
    only_shell = admin_client.get("/admin/agent_sessions/approval/?tool=sys_os_shell")
    assert shell.id.encode() in only_shell.content
    assert write.id.encode() not in only_shell.content

    response = admin_client.post(
        "/admin/agent_sessions/approval/",
        {"action": "decline", "_selected_action": [shell.id, write.id]},
    )
    assert response.status_code == 302
    for approval in (shell, write):
        approval.refresh_from_db()
        assert approval.status == "declined"
        assert approval.resolved_by.username == "root@example.com"
    assert len(events_of(session_id, "response.elicitation_resolved")) == 2
    # A second verdict changes nothing: the first stands.
    admin_client.post(
        "/admin/agent_sessions/approval/", {"action": "accept", "_selected_action": [shell.id]}
    )
    shell.refresh_from_db()
    assert shell.status == "declined"
    by_user = admin_client.get("/admin/agent_sessions/approval/?status__exact=declined")
    assert shell.id.encode() in by_user.content


def test_the_session_admin_shows_its_rules_and_changes_are_audited(
    admin_client, client_for, create_session
) -> None:
    session_id = create_session(ALICE)
    rule = {"name": "no-shell", "tools": ["sys_os_shell"], "action": "deny"}
    response = client_for(ALICE).put(
        f"/v1/sessions/{session_id}/policies", {"rules": [rule]}, format="json"
    )
    assert response.status_code == 200
    # Through the admin's own quoting: an id such as ``conv_22…`` reads as ``conv"…``
    # when put in the URL as it is.
    page = admin_client.get(
        reverse("admin:agent_sessions_session_change", args=[admin_quote(session_id)])
    )
    assert page.status_code == 200
    assert b"Effective policy rules" in page.content and b"no-shell" in page.content
    audit = admin_client.get("/admin/agent_sessions/policychange/")
    assert audit.status_code == 200 and session_id.encode() in audit.content
