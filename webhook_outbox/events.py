"""Writing webhook events: ``enqueue_webhook_event``, called by the writer of each fact.

Call it inside the transaction that stores the fact: the event row commits or rolls
back with it (the transactional outbox of automation.md). After the commit, the
delivery worker of this process is woken (``on_enqueued``), so an event leaves at once
instead of at the next poll; another process finds it at its next poll.

An event no enabled webhook takes (by its ``events`` filter) is not written: nobody
would receive it (the fan-out deletes such a row at once), and most turns end with no
webhook subscribed. The check is part of the INSERT itself (``INSERT … SELECT … WHERE
EXISTS``), so it is decided in the fact's transaction and costs no statement of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.apps import apps
from django.db import connection, transaction
from django.utils import timezone

from omnigent_site.ids import new_id
from omnigent_site.rawsql import quoted

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

    Stored only if an enabled webhook takes ``type`` now (always with ``webhook_id``);
    the event is returned either way (unsaved then: ``event._state.adding``).
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {type!r}")
    event = WebhookEvent(
        id=new_id("evt_"),
        type=type,
        created_at=timezone.now(),
        data=data,
        session_id=session_id,
        owner_id=owner_id,
        audience=sorted(audience) if audience is not None else None,
        webhook_id=webhook_id,
    )
    if webhook_id:
        event.save(force_insert=True)
    elif not _insert_if_taken(event):
        return event
    transaction.on_commit(_notify)
    return event


def _insert_if_taken(event: WebhookEvent) -> bool:
    """Store ``event`` if an enabled webhook's filter takes its type: one statement."""
    fields = _fields()
    params = [field.get_db_prep_save(getattr(event, field.attname), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(_insert_if_taken_sql(connection.vendor), [*params, event.type])
        stored = cursor.rowcount == 1
    if stored:
        event._state.adding = False
        event._state.db = connection.alias
    return stored


def _fields() -> list[Any]:
    return [field for field in WebhookEvent._meta.concrete_fields if field.column]


@functools.cache
def _insert_if_taken_sql(vendor: str) -> str:
    """``INSERT … SELECT <values> WHERE EXISTS (an enabled webhook takes the type)``;
    the type is the last parameter. The ``webhooks`` app is reached through the app
    registry: this app does not import it."""
    webhook = apps.get_model("webhooks", "Webhook")
    fields = _fields()
    columns = ", ".join(quoted(WebhookEvent, field.name) for field in fields)
    events = f"w.{quoted(webhook, 'events')}"
    if vendor == "postgresql":
        # Parameters in a select list have no type of their own (a NULL would be text).
        values = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for field in fields)
        takes = f"({events} ? CAST(%s AS text) OR {events} ? '*')"
    else:  # SQLite: the JSON list as a table
        values = ", ".join(["%s"] * len(fields))
        takes = f"EXISTS (SELECT 1 FROM json_each({events}) j WHERE j.value IN (%s, '*'))"
    return (
        f"INSERT INTO {quoted(WebhookEvent)} ({columns}) SELECT {values} "
        f"WHERE EXISTS (SELECT 1 FROM {quoted(webhook)} w "
        f"WHERE w.{quoted(webhook, 'enabled')} AND {takes})"
    )
