"""Writing webhook events: ``enqueue_webhook_event``, called by the writer of each fact.

Call it inside the transaction that stores the fact: the event row commits or rolls
back with it (the transactional outbox of automation.md). After the commit, the
delivery worker of this process is woken (``on_enqueued``), so an event leaves at once
instead of at the next poll; another process finds it at its next poll.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from omnigent_site.ids import new_id

from .models import WebhookEvent

EVENT_TYPES = (
    "turn.completed",
    "turn.failed",
    "turn.cancelled",
    "approval.requested",
    "approval.resolved",
    "session.created",
    "session.deleted",
    "runner.online",
    "runner.offline",
    "budget.exceeded",
    "schedule.run_started",
    "schedule.run_finished",
    "webhook.test",
)

_listeners: list[Callable[[], None]] = []


def on_enqueued(listener: Callable[[], None]) -> None:
    """Call ``listener`` after the commit of every transaction that enqueued an event
    (the ``webhooks`` app wakes its worker; this app does not import it)."""
    if listener not in _listeners:
        _listeners.append(listener)


def _notify() -> None:
    for listener in _listeners:
        listener()


def enqueue_webhook_event(
    *,
    type: str,
    data: dict[str, Any],
    session_id: str = "",
    owner_id: int | None = None,
    audience: Iterable[int] | None = None,
    webhook_id: str = "",
) -> WebhookEvent:
    """Store one event for the webhooks that will receive it.

    ``session_id``: the event is about a session; webhooks whose owner can read it at
    delivery time receive it. ``owner_id``: about something a user owns (a runner, a
    schedule, a budget); that user's webhooks receive it. ``audience``: the user ids
    that may receive it, fixed now (``session.deleted``: the readers just before).
    ``webhook_id``: only that webhook (``webhook.test``).
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {type!r}")
    event = WebhookEvent.objects.create(
        id=new_id("evt_"),
        type=type,
        created_at=timezone.now(),
        data=data,
        session_id=session_id,
        owner_id=owner_id,
        audience=sorted(audience) if audience is not None else None,
        webhook_id=webhook_id,
    )
    transaction.on_commit(_notify)
    return event
