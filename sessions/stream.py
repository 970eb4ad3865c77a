"""The session stream (http-api.md, Stream): replay from the event log, then the live tail.

A subscriber joins the session's channel-layer group *before* it reads the log,
so nothing published during the switch is missed; every frame carries the
event's sequence number, and a frame at or below the last one sent is dropped,
so nothing is sent twice. When the group delivers an event beyond the next
expected number (a message was dropped, or commits raced), the gap is read back
from the log first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from omnigent_site.flow import WriteWatch
from omnigent_site.shutdown import stopping

from .eventlog import session_group, sse_frame
from .models import Session, SessionEvent

log = logging.getLogger(__name__)

REPLAY_BATCH = 500
DONE = b"data: [DONE]\n\n"


def frame(payload: dict[str, Any], *, seq: int | None = None) -> bytes:
    return sse_frame(payload, seq=seq).encode("utf-8")


def parse_resume_point(header: str | None, query: str | None) -> int | None:
    """``Last-Event-ID`` wins over ``?after=``; anything not a whole number is ignored."""
    for raw in (header, query):
        if raw is not None and raw.strip().isdigit():
            return int(raw.strip())
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
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS is configured in settings"
        channel = await layer.new_channel("stream.")
        group = session_group(self.session_id)
        await layer.group_add(group, channel)
        self.watch.start()
        receiver: asyncio.Task[dict] | None = None
        shutdown = asyncio.ensure_future(stopping().wait())
        try:
            yield frame({"type": "session.heartbeat", "session_id": self.session_id})
            bounds = await log_bounds(self.session_id)
            if bounds is None:
                yield DONE
                return
            async for chunk in self._replay(bounds):
                yield chunk
            while True:
                receiver = receiver or asyncio.ensure_future(layer.receive(channel))
                done, _ = await asyncio.wait(
                    {receiver, shutdown},
                    timeout=settings.OMNIGENT_STREAM_HEARTBEAT_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if shutdown in done:
                    yield DONE
                    return
                if receiver not in done:
                    yield frame({"type": "session.heartbeat", "session_id": self.session_id})
                    continue
                message, receiver = receiver.result(), None
                if message.get("type") == "session.end":
                    yield DONE
                    return
                if message.get("type") != "session.event":
                    continue
                seq = int(message["seq"])
                if seq <= self.last:
                    continue
                if seq > self.last + 1:
                    async for chunk in self._fill(upto=seq - 1):
                        yield chunk
                yield self._emit(message["frame"].encode("utf-8"), seq)
                if self._lagging():
                    yield self._overflow()
                    return
        finally:
            if receiver is not None:
                receiver.cancel()
            shutdown.cancel()
            self.watch.stop()
            try:
                await asyncio.shield(layer.group_discard(group, channel))
            except Exception:  # noqa: BLE001 - the group entry expires on its own
                log.debug("could not leave %s", group, exc_info=True)

    async def _replay(self, bounds: tuple[int, int | None]) -> AsyncIterator[bytes]:
        last, first = bounds
        if self.after is None:
            self.last = last
            return
        pruned = first is None or first > self.after + 1
        if self.after > last or (self.after < last and pruned):
            yield frame({"type": "session.resync", "session_id": self.session_id})
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
        return frame(
            {
                "type": "stream.overflow",
                "session_id": self.session_id,
                "last_event_id": self.last,
                "message": "the client fell too far behind; reconnect with Last-Event-ID",
            }
        )
