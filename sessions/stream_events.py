"""The events of the session stream (``GET /v1/sessions/{id}/stream``; http-api.md, Stream).

Every ``data:`` payload the stream sends is a ``TypedDict`` here, built by the function
next to it; nothing else writes an event dict. Stored events (``STORED_EVENTS``) go
through ``eventlog.record_event``, which takes only these shapes; the stream itself
adds ``session.heartbeat``, ``session.resync`` and ``stream.overflow``, and the live
``session.runner``, which are never stored. ``EVENTS`` maps each ``type`` to its shape: the stream view's schema lists
them as components and the tests check each constructor against it.

The events are **compat**: Omnigent's SDK drops a payload that lacks a field it
expects, so every field here is always present unless marked ``NotRequired``. Key
order in the dicts is the order clients have always seen (it is in every stored
payload); keep it.

``response.elicitation_request`` is also the shape of the snapshot's open questions,
so it stays in ``approval_shapes.py`` (below ``shapes.py``) and is listed here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypeAlias, cast

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import ErrorInfo
from usage.shapes import SessionUsageOut

# The question event is defined with the snapshot's shapes; it is part of this stream too.
from .approval_shapes import ElicitationRequestEvent as ElicitationRequestEvent
from .approval_shapes import VerdictAction
from .approval_shapes import elicitation_request_event as elicitation_request_event
from .mcp_shapes import McpServerState
from .models import Approval, Session, SessionFile, Turn
from .shapes import (
    FlatItemOut,
    QueuedTurnOut,
    ResponseEventOut,
    SessionFileOut,
    session_file_body,
)

# --- frames of the stream itself (never stored) -----------------------------------------


class SessionHeartbeatEvent(TypedDict):
    """``session.heartbeat``: first on connect, then every 15 s while idle."""

    type: Literal["session.heartbeat"]
    session_id: str


def session_heartbeat_event(session_id: str) -> SessionHeartbeatEvent:
    return {"type": "session.heartbeat", "session_id": session_id}


class SessionResyncEvent(TypedDict):
    """``session.resync``: the resume point is older than the log keeps (or beyond its
    end); reload the snapshot. Stored events from the oldest kept one follow."""

    type: Literal["session.resync"]
    session_id: str


def session_resync_event(session_id: str) -> SessionResyncEvent:
    return {"type": "session.resync", "session_id": session_id}


class StreamOverflowEvent(TypedDict):
    """``stream.overflow``: the client read too slowly and the stream closes; resume
    from ``last_event_id``."""

    type: Literal["stream.overflow"]
    session_id: str
    last_event_id: Annotated[int, Doc("the last event sent: resume after it")]
    message: str


def stream_overflow_event(*, session_id: str, last_event_id: int) -> StreamOverflowEvent:
    return {
        "type": "stream.overflow",
        "session_id": session_id,
        "last_event_id": last_event_id,
        "message": "the client fell too far behind; reconnect with Last-Event-ID",
    }


# --- session state ----------------------------------------------------------------------


class SessionRunnerEvent(TypedDict):
    """``session.runner``: the bound runner's tunnel connected or dropped, or a runner was
    bound or unbound. Live only (no ``id:``, never stored): after a reconnect, read the
    session (``runner_id``, ``runner_online``) for the state now."""

    type: Literal["session.runner"]
    session_id: str
    runner_id: Annotated[str | None, Doc("the bound runner; null when none is")]
    runner_name: Annotated[str | None, Doc("its name (its id when it has none); null: none")]
    runner_online: Annotated[bool, Doc("whether its tunnel is live; false when none is bound")]


def session_runner_event(session: Session) -> SessionRunnerEvent:
    runner = session.runner
    return {
        "type": "session.runner",
        "session_id": session.id,
        "runner_id": session.runner_id,
        "runner_name": (runner.name or runner.id) if runner is not None else None,
        "runner_online": runner.online if runner is not None else False,
    }


class SessionStatusEvent(TypedDict):
    """``session.status``: the session's status changed (flat; ``conversation_id`` equals
    ``session_id``)."""

    type: Literal["session.status"]
    session_id: str
    conversation_id: Annotated[str, Doc("the session's id")]
    status: Annotated[str, Session.Status]
    response_id: Annotated[str | None, Doc("the running turn")]
    error: ErrorInfo | None


def session_status_event(session: Session) -> SessionStatusEvent:
    return {
        "type": "session.status",
        "session_id": session.id,
        "conversation_id": session.id,
        "status": session.status,
        "response_id": session.active_response_id,
        "error": session.last_task_error,
    }


class ConsumedInput(TypedDict):
    """The user item a turn was started with."""

    item_id: str
    type: str
    data: dict[str, Any]


class InputConsumedEvent(TypedDict):
    """``session.input.consumed``: a user message was stored and queued as a turn."""

    type: Literal["session.input.consumed"]
    data: ConsumedInput


def input_consumed_event(
    *, item_id: str, item_type: str, data: dict[str, Any]
) -> InputConsumedEvent:
    return {
        "type": "session.input.consumed",
        "data": {"item_id": item_id, "type": item_type, "data": data},
    }


class ChangedFilesInvalidatedEvent(TypedDict):
    """``session.changed_files.invalidated``: the workspace's change set changed; read
    it again."""

    type: Literal["session.changed_files.invalidated"]
    session_id: str
    environment_id: str


def changed_files_invalidated_event(
    *, session_id: str, environment_id: str
) -> ChangedFilesInvalidatedEvent:
    return {
        "type": "session.changed_files.invalidated",
        "session_id": session_id,
        "environment_id": environment_id,
    }


# --- turns ------------------------------------------------------------------------------

ResponseEventType = Literal[
    "response.created",
    "response.in_progress",
    "response.completed",
    "response.failed",
    "response.cancelled",
]
# The event that ends a turn in each terminal status.
RESPONSE_END_EVENTS: dict[str, ResponseEventType] = {
    Turn.Status.COMPLETED: "response.completed",
    Turn.Status.FAILED: "response.failed",
    Turn.Status.CANCELLED: "response.cancelled",
}


class ResponseEvent(TypedDict):
    """``response.created``, ``response.in_progress``, ``response.completed``,
    ``response.failed``, ``response.cancelled``: a turn started or ended."""

    type: ResponseEventType
    response: ResponseEventOut


def response_event(kind: ResponseEventType, response: ResponseEventOut) -> ResponseEvent:
    return {"type": kind, "response": response}


class OutputTextDeltaEvent(TypedDict):
    """``response.output_text.delta``: text the model is writing."""

    type: Literal["response.output_text.delta"]
    response_id: str
    item_id: str
    delta: str


def output_text_delta_event(*, response_id: str, item_id: str, delta: str) -> OutputTextDeltaEvent:
    return {
        "type": "response.output_text.delta",
        "response_id": response_id,
        "item_id": item_id,
        "delta": delta,
    }


class OutputItemDoneEvent(TypedDict):
    """``response.output_item.done``: a finished item (a client-side tool call waiting for
    its result shows here with ``status: "action_required"``)."""

    type: Literal["response.output_item.done"]
    response_id: str
    item: FlatItemOut


def output_item_done_event(*, response_id: str, item: dict[str, Any]) -> OutputItemDoneEvent:
    return {
        "type": "response.output_item.done",
        "response_id": response_id,
        "item": cast(FlatItemOut, item),
    }


# --- files (files.md §1) ----------------------------------------------------------------


class ResourceCreatedEvent(TypedDict):
    """``session.resource.created``: a person gave the session a file."""

    type: Literal["session.resource.created"]
    session_id: str
    resource: SessionFileOut


def resource_created_event(file: SessionFile) -> ResourceCreatedEvent:
    return {
        "type": "session.resource.created",
        "session_id": file.session_id,
        "resource": session_file_body(file),
    }


class ResourceDeletedEvent(TypedDict):
    """``session.resource.deleted``: a session file was deleted."""

    type: Literal["session.resource.deleted"]
    session_id: str
    resource_id: str
    resource_type: Literal["file"]


def resource_deleted_event(*, session_id: str, resource_id: str) -> ResourceDeletedEvent:
    return {
        "type": "session.resource.deleted",
        "session_id": session_id,
        "resource_id": resource_id,
        "resource_type": "file",
    }


# --- approvals (approvals.md) -----------------------------------------------------------


class ElicitationResolvedEvent(TypedDict):
    """``response.elicitation_resolved``: the verdict the runner was told. An expired
    question reads ``action: "cancel"``, ``reason: "unanswered"``."""

    type: Literal["response.elicitation_resolved"]
    elicitation_id: str
    action: VerdictAction
    reason: NotRequired[str]
    resolved_by: NotRequired[Annotated[str, Doc("the user id of who answered")]]


def elicitation_resolved_event(
    approval: Approval, *, resolved_by: str | None
) -> ElicitationResolvedEvent:
    action = approval.action
    assert action is not None, "only a resolved approval has an action"
    event: ElicitationResolvedEvent = {
        "type": "response.elicitation_resolved",
        "elicitation_id": approval.id,
        "action": cast(VerdictAction, action),
    }
    if approval.reason:
        event["reason"] = approval.reason
    if resolved_by:
        event["resolved_by"] = resolved_by
    return event


class PolicyDeniedEvent(TypedDict):
    """``response.policy_denied``: a rule refused a tool call; the turn goes on."""

    type: Literal["response.policy_denied"]
    conversation_id: Annotated[str, Doc("the session's id")]
    session_id: str
    response_id: str
    call_id: str
    tool: str
    policy_name: str
    reason: str
    phase: Literal["tool_call"]


def policy_denied_event(
    *, session_id: str, response_id: str, call_id: str, tool: str, policy_name: str, reason: str
) -> PolicyDeniedEvent:
    return {
        "type": "response.policy_denied",
        "conversation_id": session_id,
        "session_id": session_id,
        "response_id": response_id,
        "call_id": call_id,
        "tool": tool,
        "policy_name": policy_name,
        "reason": reason,
        "phase": "tool_call",
    }


class McpStatusEvent(TypedDict):
    """``session.mcp_status``: the session's MCP servers and their state (mcp.md)."""

    type: Literal["session.mcp_status"]
    session_id: str
    servers: dict[str, McpServerState]


def mcp_status_event(*, session_id: str, servers: dict[str, McpServerState]) -> McpStatusEvent:
    return {"type": "session.mcp_status", "session_id": session_id, "servers": servers}


class SessionQueueEvent(TypedDict):
    """``session.queue``: the session's turns waiting for a runner slot changed, or their
    places did (usage.md, Fair share); an empty list once all have started."""

    type: Literal["session.queue"]
    session_id: str
    queued_turns: list[QueuedTurnOut]


def session_queue_event(*, session_id: str, queued_turns: list[QueuedTurnOut]) -> SessionQueueEvent:
    return {"type": "session.queue", "session_id": session_id, "queued_turns": queued_turns}


class SessionUsageEvent(TypedDict):
    """``session.usage``: the session's usage totals, after each turn that called a
    model, stored before the turn's end event (docs/usage.md)."""

    type: Literal["session.usage"]
    session_id: str
    usage: SessionUsageOut


def session_usage_event(*, session_id: str, usage: SessionUsageOut) -> SessionUsageEvent:
    return {"type": "session.usage", "session_id": session_id, "usage": usage}


# --- the registry -----------------------------------------------------------------------

# What ``eventlog.record_event`` stores and the stream replays.
StoredEvent: TypeAlias = (
    SessionStatusEvent
    | InputConsumedEvent
    | ChangedFilesInvalidatedEvent
    | ResponseEvent
    | OutputTextDeltaEvent
    | OutputItemDoneEvent
    | ResourceCreatedEvent
    | ResourceDeletedEvent
    | ElicitationRequestEvent
    | ElicitationResolvedEvent
    | PolicyDeniedEvent
    | McpStatusEvent
    | SessionQueueEvent
    | SessionUsageEvent
)

# Each stored event type and its shape, in the order the schema lists them.
STORED_EVENTS: dict[str, type] = {
    "session.status": SessionStatusEvent,
    "session.input.consumed": InputConsumedEvent,
    "response.created": ResponseEvent,
    "response.in_progress": ResponseEvent,
    "response.completed": ResponseEvent,
    "response.failed": ResponseEvent,
    "response.cancelled": ResponseEvent,
    "response.output_text.delta": OutputTextDeltaEvent,
    "response.output_item.done": OutputItemDoneEvent,
    "session.changed_files.invalidated": ChangedFilesInvalidatedEvent,
    "session.resource.created": ResourceCreatedEvent,
    "session.resource.deleted": ResourceDeletedEvent,
    "response.elicitation_request": ElicitationRequestEvent,
    "response.elicitation_resolved": ElicitationResolvedEvent,
    "response.policy_denied": PolicyDeniedEvent,
    "session.mcp_status": McpStatusEvent,
    "session.queue": SessionQueueEvent,
    "session.usage": SessionUsageEvent,
}

# Every event type of the session stream and its shape.
EVENTS: dict[str, type] = {
    "session.heartbeat": SessionHeartbeatEvent,
    **STORED_EVENTS,
    "session.runner": SessionRunnerEvent,
    "session.resync": SessionResyncEvent,
    "stream.overflow": StreamOverflowEvent,
}
