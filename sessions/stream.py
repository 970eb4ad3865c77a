"""The session stream (http-api.md, Stream): replay from the event log, then the live tail.

A subscriber joins the session's channel-layer group *before* it reads the log,
so nothing published during the switch is missed; every frame carries the
event's sequence number, and a frame at or below the last one sent is dropped,
so nothing is sent twice. When the group delivers an event beyond the next
expected number (a message was dropped, or commits raced), the gap is read back
from the log first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from omnigent_site.domain_errors import InvalidInput
from omnigent_site.runtime.flow import WriteWatch

from .eventlog import session_group
from .models import Session, SessionEvent
from .runner_presence import LIVE_FRAME
from .sse import DONE, GroupFeed, frame
from .stream_events import session_heartbeat_event, session_resync_event, stream_overflow_event

log = logging.getLogger(__name__)

REPLAY_BATCH = 500


# A resume point is an event id: 1 to 19 ASCII digits, at most the largest int64.
_RESUME_POINT = re.compile(r"[0-9]{1,19}")
_MAX_RESUME_POINT = 2**63 - 1
# How the views document ``after`` and ``Last-Event-ID`` (OpenAPI schema).
RESUME_POINT_SCHEMA: dict[str, Any] = {
    "type": "integer",
    "minimum": 0,
    "maximum": _MAX_RESUME_POINT,
}


def parse_resume_point(header: str | None, query: str | None) -> int | None:
    """The event id to resume after: ``Last-Event-ID`` wins over ``?after=``.

    Absent or blank means "no resume point" (live events only); anything else that is
    not an event id (a sign, a non-ASCII digit such as ``²``, 5,000 digits, a byte that
    is not ASCII) is refused with 400 rather than guessed at (http-api.md, Input
    strictness). ``str.isdigit`` and ``int`` alone accepted ``²`` and failed on long
    numbers with a 500. The refused value is never echoed.
    """
    for name, raw in (("Last-Event-ID", header), ("after", query)):
        if raw is None or not raw.strip(" \t"):
            continue
        value = raw.strip(" \t")
        if not _RESUME_POINT.fullmatch(value) or int(value) > _MAX_RESUME_POINT:
            raise InvalidInput(
                "must be an event id: a whole number of 1 to 19 ASCII digits", field=name
            )
        return int(value)
    return None


def _log_bounds(session_id: str) -> tuple[int, int | None] | None:
    last = Session.objects.filter(pk=session_id).values_list("last_event_seq", flat=True).first()
    if last is None:
        return None
    first = (
        SessionEvent.objects.filter(session_id=session_id)
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    return last, first


def _events_between(session_id: str, after: int, upto: int | None) -> list[tuple[int, dict]]:
    rows = SessionEvent.objects.filter(session_id=session_id, seq__gt=after)
    if upto is not None:
        rows = rows.filter(seq__lte=upto)
    return list(rows.order_by("seq").values_list("seq", "payload")[:REPLAY_BATCH])


log_bounds = sync_to_async(_log_bounds)
events_between = sync_to_async(_events_between)


class SessionStream:
    """One subscriber's stream; iterate it for the response body."""

    def __init__(self, *, session_id: str, after: int | None, watch: WriteWatch | None) -> None:
        self.session_id = session_id
        self.after = after
        self.watch = watch or WriteWatch(None)
        self.last = 0
        self.sent_while_paused = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # The group is joined before the log is read: nothing published in between
        # is missed, and what arrives twice is dropped by sequence number.
        async with GroupFeed(session_group(self.session_id)) as feed:
            self.watch.start()
            try:
                yield frame(session_heartbeat_event(self.session_id))
                bounds = await log_bounds(self.session_id)
                if bounds is None:
                    yield DONE
                    return
                async for chunk in self._replay(bounds):
                    yield chunk
                async for batch in feed.batches():
                    chunks: list[bytes] = []
                    ended = await self._render(batch, chunks)
                    if chunks:
                        yield b"".join(chunks)
                    if ended:
                        return
            finally:
                self.watch.stop()

    async def _render(self, batch: list[dict[str, Any]], chunks: list[bytes]) -> bool:
        """Append the frames for ``batch`` to ``chunks``; True when the stream must end."""
        for message in batch:
            kind = message.get("type")
            if kind in ("session.end", "server.stop"):
                chunks.append(DONE)
                return True
            if kind == "stream.heartbeat" and len(batch) == 1:
                chunks.append(frame(session_heartbeat_event(self.session_id)))
            elif kind == LIVE_FRAME:  # a live-only frame (runner_presence): sent as it is
                chunks.append(message["frame"].encode("utf-8"))
            elif kind == "session.events" and await self._render_events(message["events"], chunks):
                return True
        return False

    async def _render_events(self, events: list[list[Any]], chunks: list[bytes]) -> bool:
        """Live events, deduplicated, with any gap filled from the log first."""
        for seq, rendered in events:
            if seq <= self.last:
                continue
            if seq > self.last + 1:
                async for chunk in self._fill(upto=seq - 1):
                    chunks.append(chunk)
            chunks.append(self._emit(rendered.encode("utf-8"), seq))
            if self._lagging():
                chunks.append(self._overflow())
                return True
        return False

    async def _replay(self, bounds: tuple[int, int | None]) -> AsyncIterator[bytes]:
        last, first = bounds
        if self.after is None:
            self.last = last
            return
        pruned = first is None or first > self.after + 1
        if self.after > last or (self.after < last and pruned):
            yield frame(session_resync_event(self.session_id))
            self.last = (first - 1) if first is not None and self.after <= last else last
        else:
            self.last = self.after
        async for chunk in self._fill(upto=None):
            yield chunk

    async def _fill(self, *, upto: int | None) -> AsyncIterator[bytes]:
        while True:
            rows = await events_between(self.session_id, self.last, upto)
            for seq, payload in rows:
                yield self._emit(frame(payload, seq=seq), seq)
            if len(rows) < REPLAY_BATCH:
                return

    def _emit(self, rendered: bytes, seq: int) -> bytes:
        self.last = seq
        if self.watch.paused:
            self.sent_while_paused += 1
        else:
            self.sent_while_paused = 0
        return rendered

    def _lagging(self) -> bool:
        return self.sent_while_paused > settings.OMNIGENT_STREAM_MAX_LAG

    def _overflow(self) -> bytes:
        log.info("stream of %s: subscriber fell behind at %s, closing", self.session_id, self.last)
        return frame(stream_overflow_event(session_id=self.session_id, last_event_id=self.last))
