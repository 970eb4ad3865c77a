"""Who receives each outbox event: one ``Delivery`` row per receiving webhook.

Run by the delivery worker of any server process; the events are claimed with
``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL (on SQLite the write transaction
itself serialises the processes), so each event is fanned out once. An event nobody
receives is deleted at once.

A webhook receives (automation.md): events of sessions its owner can read now (a
grant, or an admin), the ``session.deleted`` of sessions its owner could read just
before (``audience``), events of what its owner owns (``owner_id``: runners,
schedules, budgets), and the ``webhook.test`` sent to it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from omnigent_site.ids import new_id
from omnigent_site.rawsql import insert_values
from omnigent_site.users import is_admin
from sessions.models import Permission
from webhook_outbox.models import WebhookEvent

from .models import Delivery, Webhook

FAN_OUT_BATCH = 500
# A new delivery's columns (the others start NULL).
DELIVERY_COLUMNS = (
    "id",
    "webhook",
    "event",
    "created_at",
    "status",
    "attempts",
    "last_error",
    "extra_attempts",
    "next_attempt_at",
    "updated_at",
)


def session_readers(session_ids: Iterable[str]) -> dict[str, set[int]]:
    """The users holding a grant (any level reads) on each session."""
    readers: dict[str, set[int]] = defaultdict(set)
    ids = [session_id for session_id in set(session_ids) if session_id]
    if ids:
        grants = Permission.objects.filter(session_id__in=ids).values_list("session_id", "user_id")
        for session_id, user_id in grants:
            readers[session_id].add(user_id)
    return readers


def may_receive(
    webhook: Webhook, event: WebhookEvent, *, readers: dict[str, set[int]], admin: bool
) -> bool:
    """Whether ``webhook`` may receive ``event`` now (its type filter aside)."""
    if event.webhook_id:
        return event.webhook_id == webhook.id
    if event.audience is not None:
        return admin or webhook.owner_id in event.audience
    if event.session_id:
        return admin or webhook.owner_id in readers.get(event.session_id, ())
    if event.owner_id is not None:
        return webhook.owner_id == event.owner_id
    return False


def fan_out(*, now: datetime, limit: int = FAN_OUT_BATCH) -> int:
    """Give up to ``limit`` undispatched events their delivery rows; returns how many
    events were taken."""
    # A plain read first: an idle process takes no write lock (SQLite has one).
    if not WebhookEvent.objects.filter(dispatched=False).exists():
        return 0
    with transaction.atomic():
        events = list(
            WebhookEvent.objects.filter(dispatched=False)
            .order_by("created_at", "id")
            .select_for_update(skip_locked=True)[:limit]
        )
        if not events:
            return 0
        webhooks = list(Webhook.objects.filter(enabled=True).select_related("owner"))
        admins = {webhook.owner_id for webhook in webhooks if is_admin(webhook.owner)}
        readers = session_readers(event.session_id for event in events)
        # status, attempts, last_error, extra_attempts, next_attempt_at, updated_at
        pending = (Delivery.Status.PENDING.value, 0, "", 0, now, now)
        # Values, not ``Delivery`` instances: building a model and ``bulk_create``'s
        # statement cost more than storing the row (``rawsql.insert_values``).
        rows: list[tuple[object, ...]] = []
        received: set[str] = set()
        for event in events:
            for webhook in webhooks:
                # A webhook hears what happens after it exists, not the backlog that
                # waited for this pass.
                if not webhook.receives(event.type) or webhook.created_at > event.created_at:
                    continue
                if not may_receive(
                    webhook, event, readers=readers, admin=webhook.owner_id in admins
                ):
                    continue
                rows.append((new_id("whd_"), webhook.id, event.id, event.created_at, *pending))
                received.add(event.id)
        insert_values(Delivery, DELIVERY_COLUMNS, rows, ignore_conflicts=True)
        if received:
            WebhookEvent.objects.filter(id__in=received).update(dispatched=True)
        unreceived = [event.id for event in events if event.id not in received]
        if unreceived:
            WebhookEvent.objects.filter(id__in=unreceived).delete()
    return len(events)
