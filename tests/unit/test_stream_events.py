"""Every event of the two SSE streams, built by its constructor, has the keys the spec
names (http-api.md Stream, approvals.md, files.md), in wire order, and exactly the keys
its shape declares; a new event type without a line here fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, get_args

import pytest

from sessions import stream_events, updates_events
from sessions.eventlog import sse_frame
from sessions.models import Agent, Approval, Session, SessionFile, Turn
from sessions.shapes import response_event_body
from usage.shapes import session_usage_body

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

# The keys of each event, in the order the spec lists them (and clients have seen them).
SESSION_STREAM_KEYS: dict[str, list[str]] = {
    "session.heartbeat": ["type", "session_id"],
    "session.status": ["type", "session_id", "conversation_id", "status", "response_id", "error"],
    "session.input.consumed": ["type", "data"],
    "response.created": ["type", "response"],
    "response.in_progress": ["type", "response"],
    "response.completed": ["type", "response"],
    "response.failed": ["type", "response"],
    "response.cancelled": ["type", "response"],
    "response.output_text.delta": ["type", "response_id", "item_id", "delta"],
    "response.output_item.done": ["type", "response_id", "item"],
    "session.changed_files.invalidated": ["type", "session_id", "environment_id"],
    "session.resource.created": ["type", "session_id", "resource"],
    "session.resource.deleted": ["type", "session_id", "resource_id", "resource_type"],
    "response.elicitation_request": [
        "type",
        "elicitation_id",
        "session_id",
        "response_id",
        "method",
        "params",
    ],
    "response.elicitation_resolved": ["type", "elicitation_id", "action", "reason", "resolved_by"],
    "response.policy_denied": [
        "type",
        "conversation_id",
        "session_id",
        "response_id",
        "call_id",
        "tool",
        "policy_name",
        "reason",
        "phase",
    ],
    "session.mcp_status": ["type", "session_id", "servers"],
    "session.queue": ["type", "session_id", "queued_turns"],
    "session.usage": ["type", "session_id", "usage"],
    "session.runner": ["type", "session_id", "runner_id", "runner_name", "runner_online"],
    "session.resync": ["type", "session_id"],
    "stream.overflow": ["type", "session_id", "last_event_id", "message"],
}

LIST_STREAM_KEYS: dict[str, list[str]] = {
    "session.heartbeat": ["type"],
    "session.added": ["type", "session"],
    "session.updated": ["type", "session"],
    "session.removed": ["type", "session_id"],
    "session.resync": ["type"],
}


def a_session() -> Session:
    agent = Agent(id="ag_1", name="file-helper", model="mock-model", created_at=NOW)
    return Session(
        id="conv_1",
        agent=agent,
        status=Session.Status.FAILED,
        active_response_id=None,
        last_task_error={"code": "boom", "message": "it broke"},
        created_at=NOW,
        updated_at=NOW,
        title="first try",
    )


def an_approval(session: Session) -> Approval:
    return Approval(
        id="elicit_1",
        session=session,
        response_id="resp_1",
        call_id="call_1",
        tool="sys_os_shell",
        arguments={"command": "ls"},
        policy_name="ask-shell",
        message="Agent wants to run sys_os_shell: `ls`. Approve?",
        status=Approval.Status.DECLINED,
        reason="not now",
        created_at=NOW,
        expires_at=NOW,
    )


def session_stream_events() -> dict[str, Callable[[], Any]]:
    session = a_session()
    turn = Turn(id="resp_1", session=session, status=Turn.Status.COMPLETED, created_at=NOW)
    body = response_event_body(turn, output=[], model="mock-model")
    file = SessionFile(
        id="file_1",
        session=session,
        blob_id="ab" * 32,
        name="notes.txt",
        bytes=5,
        content_type="text/plain",
        created_at=NOW,
    )
    approval = an_approval(session)
    item = {"role": "assistant", "id": "item_1", "type": "message", "status": "completed"}
    events = stream_events
    responses = {
        kind: (lambda kind=kind: events.response_event(kind, body))
        for kind in (
            "response.created",
            "response.in_progress",
            "response.completed",
            "response.failed",
            "response.cancelled",
        )
    }
    return {
        "session.heartbeat": lambda: events.session_heartbeat_event("conv_1"),
        "session.status": lambda: events.session_status_event(session),
        "session.input.consumed": lambda: events.input_consumed_event(
            item_id="item_0", item_type="message", data={"role": "user", "content": "hi"}
        ),
        **responses,
        "response.output_text.delta": lambda: events.output_text_delta_event(
            response_id="resp_1", item_id="item_1", delta="Hel"
        ),
        "response.output_item.done": lambda: events.output_item_done_event(
            response_id="resp_1", item=item
        ),
        "session.changed_files.invalidated": lambda: events.changed_files_invalidated_event(
            session_id="conv_1", environment_id="env_1"
        ),
        "session.resource.created": lambda: events.resource_created_event(file),
        "session.resource.deleted": lambda: events.resource_deleted_event(
            session_id="conv_1", resource_id="file_1"
        ),
        "response.elicitation_request": lambda: events.elicitation_request_event(approval),
        "response.elicitation_resolved": lambda: events.elicitation_resolved_event(
            approval, resolved_by="ada"
        ),
        "response.policy_denied": lambda: events.policy_denied_event(
            session_id="conv_1",
            response_id="resp_1",
            call_id="call_1",
            tool="sys_os_shell",
            policy_name="no-shell",
            reason="shell is off",
        ),
        "session.mcp_status": lambda: events.mcp_status_event(
            session_id="conv_1",
            servers={"git": {"status": "ready", "transport": "stdio", "tools": ["git__status"]}},
        ),
        "session.queue": lambda: events.session_queue_event(
            session_id="conv_1", queued_turns=[{"response_id": "resp_1", "position": 1}]
        ),
        "session.usage": lambda: events.session_usage_event(
            session_id="conv_1",
            usage=session_usage_body([("gpt-4o", {"input_tokens": 3, "llm_calls": 1})]),
        ),
        "session.resync": lambda: events.session_resync_event("conv_1"),
        "stream.overflow": lambda: events.stream_overflow_event(
            session_id="conv_1", last_event_id=7
        ),
        "session.runner": lambda: events.session_runner_event(session),
    }


def list_stream_events() -> dict[str, Callable[[], Any]]:
    session = a_session()
    events = updates_events
    return {
        "session.heartbeat": events.list_heartbeat_event,
        "session.added": lambda: events.session_row_event("session.added", session, level=4),
        "session.updated": lambda: events.session_row_event("session.updated", session, level=1),
        "session.removed": lambda: events.session_removed_event("conv_1"),
        "session.resync": events.list_resync_event,
    }


STREAMS = [
    pytest.param(stream_events.EVENTS, SESSION_STREAM_KEYS, session_stream_events, id="session"),
    pytest.param(updates_events.EVENTS, LIST_STREAM_KEYS, list_stream_events, id="list"),
]


@pytest.mark.parametrize(("registry", "spec", "constructors"), STREAMS)
def test_every_event_type_has_a_shape_a_constructor_and_the_spec_keys(
    registry: dict[str, type], spec: dict[str, list[str]], constructors: Callable[[], Any]
) -> None:
    built = constructors()
    assert set(registry) == set(spec) == set(built)
    for kind, construct in built.items():
        payload = construct()
        assert payload["type"] == kind
        assert list(payload) == spec[kind], kind
        assert set(payload) == set(registry[kind].__annotations__), kind
        json.dumps(payload)  # stored and framed as JSON


def test_optional_keys_are_left_out_when_there_is_nothing_to_say() -> None:
    approval = an_approval(a_session())
    approval.reason = None
    payload = stream_events.elicitation_resolved_event(approval, resolved_by=None)
    assert list(payload) == ["type", "elicitation_id", "action"]


def test_stored_events_are_the_session_stream_without_its_own_frames() -> None:
    own = {"session.heartbeat", "session.runner", "session.resync", "stream.overflow"}
    assert set(stream_events.STORED_EVENTS) == set(stream_events.EVENTS) - own
    # The type ``record_event`` takes lists the same shapes as the table.
    assert set(get_args(stream_events.StoredEvent)) == set(stream_events.STORED_EVENTS.values())


def test_frames_are_byte_for_byte_the_wire_format() -> None:
    """The frames clients have always read: compact JSON, keys in spec order."""
    status = stream_events.session_status_event(a_session())
    assert sse_frame(status, seq=3) == (
        "event: session.status\nid: 3\n"
        'data: {"type":"session.status","session_id":"conv_1","conversation_id":"conv_1",'
        '"status":"failed","response_id":null,"error":{"code":"boom","message":"it broke"}}\n\n'
    )
    delta = stream_events.output_text_delta_event(response_id="r", item_id="i", delta="é\n")
    assert sse_frame(delta, seq=4) == (
        "event: response.output_text.delta\nid: 4\n"
        'data: {"type":"response.output_text.delta","response_id":"r","item_id":"i",'
        '"delta":"\\u00e9\\n"}\n\n'
    )
    assert sse_frame(updates_events.list_heartbeat_event()) == (
        'event: session.heartbeat\ndata: {"type":"session.heartbeat"}\n\n'
    )
