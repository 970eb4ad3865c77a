"""The session event log: every event a watcher can see passes through ``record_event``.

Each event gets the session's next sequence number in the same transaction that
stores it, and is published to the session's channel-layer group once that
transaction commits. The stream replays the log on resume and uses the numbers
to fill any gap in what the group delivered, so no watcher sees a gap or a
duplicate.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import F

from .models import Session, SessionEvent

log = logging.getLogger(__name__)

PRUNE_EVERY = 100


def session_group(session_id: str) -> str:
    """The channel-layer group every watcher of the session joins."""
    return f"session.{session_id}"


def record_event(*, session_id: str, payload: dict[str, Any]) -> SessionEvent:
    """Store ``payload`` (which carries its ``type``) as the session's next event."""
    assert "type" in payload, "an event payload names its type"
    with transaction.atomic():
        # The UPDATE takes the row lock first, so concurrent writers queue here
        # and each reads back its own number.
        Session.objects.filter(pk=session_id).update(last_event_seq=F("last_event_seq") + 1)
        seq = Session.objects.filter(pk=session_id).values_list("last_event_seq", flat=True).get()
        event = SessionEvent.objects.create(
            session_id=session_id, seq=seq, type=payload["type"], payload=payload
        )
        if seq % PRUNE_EVERY == 0:
            _prune(session_id=session_id, newest=seq)
        transaction.on_commit(lambda: _publish_or_hold(event))
    return event


_held = threading.local()


@contextmanager
def publishing_together() -> Iterator[None]:
    """Hold the events committed inside the block; publish them after it, together.

    Subscribers then get one group message per session for the whole block instead
    of one per event, which is what bounds how fast a busy session can be fanned out.
    """
    if getattr(_held, "events", None) is not None:
        yield  # already inside a block: the outer one publishes
        return
    held: list[SessionEvent] = []
    _held.events = held
    try:
        yield
    finally:
        _held.events = None
        publish_events(held)


def _publish_or_hold(event: SessionEvent) -> None:
    held = getattr(_held, "events", None)
    if held is not None:
        held.append(event)
    else:
        publish_events([event])


def _prune(*, session_id: str, newest: int) -> None:
    keep = max(int(settings.OMNIGENT_EVENT_RETENTION), 1)
    SessionEvent.objects.filter(session_id=session_id, seq__lte=newest - keep).delete()


def sse_frame(payload: dict[str, Any], *, seq: int | None = None) -> str:
    """One Server-Sent Events frame: ``event:``, ``id:`` (the sequence) and ``data:``."""
    lines = [f"event: {payload['type']}"]
    if seq is not None:
        lines.append(f"id: {seq}")
    lines.append("data: " + json.dumps(payload, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def group_messages(events: list[SessionEvent]) -> dict[str, dict[str, Any]]:
    """One ``session.events`` message per session, frames rendered once (not per subscriber)."""
    messages: dict[str, dict[str, Any]] = {}
    for event in events:
        message = messages.setdefault(event.session_id, {"type": "session.events", "events": []})
        message["events"].append([event.seq, sse_frame(event.payload, seq=event.seq)])
    return messages


def publish_events(events: list[SessionEvent]) -> None:
    if not events:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    for session_id, message in group_messages(events).items():
        try:
            async_to_sync(layer.group_send)(session_group(session_id), message)
        except Exception:
            # Watchers recover from the log; a failed publish must not fail the write.
            log.exception("could not publish events of %s", session_id)


def publish_session_end(*, session_id: str, reason: str) -> None:
    """Tell every watcher the stream is over (the session was deleted)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            session_group(session_id), {"type": "session.end", "reason": reason}
        )
    except Exception:
        log.exception("could not publish the end of %s", session_id)
