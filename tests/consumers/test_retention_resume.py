"""A stream resumed across event-log compaction (lifecycle.md, Retention): a resume
point that was compacted away gets ``session.resync`` and then the kept events, never
a gap presented as complete; one still kept resumes as before."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from sessions import retention
from sessions.models import SessionEvent

from .test_stream_asgi import StreamCall, _record, _session

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


def _compact(session_id: str) -> int:
    now = timezone.now()
    SessionEvent.objects.filter(session_id=session_id).update(created_at=now - timedelta(days=40))
    removed = retention.compact_event_logs(now=now, dry_run=False)
    assert list(
        SessionEvent.objects.filter(session_id=session_id).values_list("seq", flat=True)[:1]
    ) == [91]
    return removed


async def _frames(call: StreamCall, *, until_id: int) -> list[tuple[str, int | None]]:
    """(event type, id) of each frame until the one with ``until_id``."""
    await call.start()
    received = b""
    while f"id: {until_id}\n".encode() not in received:
        received += await call.next_body()
    frames = []
    for block in received.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            frames.append((lines["event"], int(lines["id"]) if "id" in lines else None))
    return frames


async def test_a_resume_point_compacted_away_gets_resync(make_bundle: Any, settings: Any) -> None:
    session_id = await database_sync_to_async(_session)(make_bundle)
    await database_sync_to_async(_record)(session_id, 120)
    # Keep 30 days and the last 30 events: 1..90 go (all are 40 days old).
    settings.OMNIGENT_EVENT_LOG_KEEP_DAYS = 30
    settings.OMNIGENT_EVENT_RETENTION = 30
    assert await database_sync_to_async(_compact)(session_id) == 90

    stale = StreamCall(session_id, headers=[(b"last-event-id", b"50")])
    frames = await _frames(stale, until_id=120)
    assert frames[:3] == [
        ("session.heartbeat", None),
        ("session.resync", None),
        ("test.event", 91),
    ]
    assert [seq for _, seq in frames[2:]] == list(range(91, 121))
    await stale.disconnect()

    kept = StreamCall(session_id, headers=[(b"last-event-id", b"100")])
    frames = await _frames(kept, until_id=120)
    assert [kind for kind, _ in frames].count("session.resync") == 0
    assert [seq for _, seq in frames[1:]] == list(range(101, 121))
    await kept.disconnect()
