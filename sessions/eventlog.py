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
        transaction.on_commit(lambda: publish_event(event))
    return event


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


def group_message(event: SessionEvent) -> dict[str, Any]:
    # Rendered once here rather than once per subscriber.
    return {
        "type": "session.event",
        "seq": event.seq,
        "frame": sse_frame(event.payload, seq=event.seq),
    }


def publish_event(event: SessionEvent) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(event.session_id), group_message(event))
    except Exception:
        # Watchers recover from the log; a failed publish must not fail the write.
        log.exception("could not publish event %s of %s", event.seq, event.session_id)


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
