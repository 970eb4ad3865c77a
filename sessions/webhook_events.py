"""The webhook events of session facts (automation.md, Event types), each written by the
fact's writer in the fact's own transaction (``webhook_outbox``: the outbox).

``data`` holds the session id and what the event is about, in the API's shapes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook_outbox.events import enqueue_webhook_event

from .approval_shapes import elicitation_body
from .models import Approval, Session, Turn

TURN_END_EVENTS = {
    "completed": "turn.completed",
    "failed": "turn.failed",
    "cancelled": "turn.cancelled",
}


def session_created(session: Session) -> None:
    enqueue_webhook_event(
        type="session.created",
        data={
            "session_id": session.id,
            "agent_id": session.agent_id,
            "title": session.title,
            "labels": session.labels,
        },
        session_id=session.id,
    )


def session_deleted(*, session_id: str, readers: Iterable[int]) -> None:
    """Delivered to the webhooks of those who could read it just before (``readers``)."""
    enqueue_webhook_event(
        type="session.deleted",
        data={"session_id": session_id},
        session_id=session_id,
        audience=readers,
    )


def turn_ended(turn: Turn) -> None:
    kind = TURN_END_EVENTS.get(str(turn.status))
    if kind is None:
        return
    data: dict[str, Any] = {
        "session_id": turn.session_id,
        "response_id": turn.id,
        "status": turn.status,
        "error": turn.error,
        # The turn's usage once turns record it (usage.md); null until then.
        "usage": getattr(turn, "usage", None),
    }
    enqueue_webhook_event(type=kind, data=data, session_id=turn.session_id)


def approval_requested(approval: Approval) -> None:
    _approval_event("approval.requested", approval)


def approval_resolved(approval: Approval) -> None:
    _approval_event("approval.resolved", approval)


def _approval_event(kind: str, approval: Approval) -> None:
    enqueue_webhook_event(
        type=kind,
        data={
            "session_id": approval.session_id,
            "response_id": approval.response_id,
            "status": approval.status,
            "approval": elicitation_body(approval),
        },
        session_id=approval.session_id,
    )


def budget_exceeded(
    *,
    session_id: str,
    response_id: str | None,
    scope: str | None,
    budget_usd: float | None,
    spent_usd: float | None,
    error: dict[str, Any] | None,
    status: str | None = None,
) -> None:
    """A budget stopped work (usage.md, Budgets): a turn ended ``failed`` with
    ``budget_exceeded``, or a message was refused (409/429, ``response_id`` null)."""
    enqueue_webhook_event(
        type="budget.exceeded",
        data={
            "session_id": session_id,
            "response_id": response_id,
            "status": status,
            "scope": scope,
            "budget_usd": budget_usd,
            "spent_usd": spent_usd,
            "error": error,
        },
        session_id=session_id,
    )
