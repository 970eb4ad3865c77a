"""One subscriber's ``GET /v1/sessions/updates`` stream (design in ``sessions/updates.py``).

The same frame rules as the session stream: a ``session.heartbeat`` on connect and
after ``OMNIGENT_STREAM_HEARTBEAT_S`` without a message, ``data: [DONE]`` when the
server shuts down. Every list frame carries its number in the user's list log.

A subscriber joins the user's group, then reads the log's bounds, then sends the
heartbeat: a frame at or below the newest number read then is dropped (the list the
client loads after the first frame shows it already), one beyond the next expected
number has its gap read back from the log first. A client that resumes after ``n``
gets what it missed from the log before the live tail, or ``session.resync`` when
the log no longer holds what followed ``n`` (or never held ``n``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from .list_watch import mark_list_open
from .sse import DONE, GroupFeed, frame
from .updates import log_bounds, missed_frames, user_group
from .updates_events import list_heartbeat_event, list_resync_event

_log_bounds = sync_to_async(log_bounds)
_missed_frames = sync_to_async(missed_frames)


class UpdatesStream:
    """Iterate it for the response body."""

    def __init__(self, *, user_pk: int, after: int | None) -> None:
        self.user_pk = user_pk
        self.after = after
        self.last = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Marked open, then joined, then the log read, before anything is sent: a client
        # that reloads its list on the first frame misses nothing written after that
        # (list_watch.py), and what it reloads is not sent again.
        await mark_list_open()
        marked = time.monotonic()
        async with GroupFeed(user_group(self.user_pk)) as feed:
            newest, oldest = await _log_bounds(user_pk=self.user_pk)
            yield frame(list_heartbeat_event())
            self.last = newest
            if self.after is not None:
                async for chunk in self._resume(newest, oldest, self.after):
                    yield chunk
            async for batch in feed.batches():
                # A batch comes at least every heartbeat interval (a heartbeat, if nothing else).
                if time.monotonic() - marked >= settings.OMNIGENT_STREAM_HEARTBEAT_S:
                    await mark_list_open()
                    marked = time.monotonic()
                chunks, ended = await self._render(batch)
                if chunks:
                    yield b"".join(chunks)
                if ended:
                    return

    async def _resume(self, newest: int, oldest: int | None, after: int) -> AsyncIterator[bytes]:
        kept = after == newest or (oldest is not None and oldest <= after + 1 <= newest)
        if not kept:
            yield frame(list_resync_event(), seq=newest)
            return
        for _seq, rendered in await _missed_frames(user_pk=self.user_pk, after=after, upto=newest):
            yield rendered.encode("utf-8")

    async def _render(self, batch: list[dict[str, Any]]) -> tuple[list[bytes], bool]:
        """The frames for a batch of inbox messages, and whether the stream ends."""
        chunks: list[bytes] = []
        for message in batch:
            kind = message.get("type")
            if kind == "server.stop":
                chunks.append(DONE)
                return chunks, True
            if kind == "stream.heartbeat" and len(batch) == 1:
                chunks.append(frame(list_heartbeat_event()))
            elif kind == "session.updates":
                seq = int(message["seq"])
                if seq <= self.last:
                    continue
                if seq > self.last + 1:
                    for _seq, rendered in await _missed_frames(
                        user_pk=self.user_pk, after=self.last, upto=seq - 1
                    ):
                        chunks.append(rendered.encode("utf-8"))
                self.last = seq
                chunks.append(str(message["frame"]).encode("utf-8"))
        return chunks, False
