"""One subscriber's ``GET /v1/sessions/updates`` stream (design in ``sessions/updates.py``).

The same frame rules as the session stream: a ``session.heartbeat`` on connect and
after ``OMNIGENT_STREAM_HEARTBEAT_S`` without a message, ``data: [DONE]`` when the
server shuts down, ``session.resync`` when the client resumes (``Last-Event-ID``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings

from .list_watch import mark_list_open
from .sse import DONE, GroupFeed, frame
from .updates import user_group


class UpdatesStream:
    """Iterate it for the response body."""

    def __init__(self, *, user_pk: int, resumed: bool) -> None:
        self.user_pk = user_pk
        self.resumed = resumed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Marked open, then joined, before anything is sent: a client that reloads its
        # list on the first frame misses nothing written after that (list_watch.py).
        await mark_list_open()
        marked = time.monotonic()
        async with GroupFeed(user_group(self.user_pk)) as feed:
            yield frame({"type": "session.heartbeat"})
            if self.resumed:
                yield frame({"type": "session.resync"})
            async for batch in feed.batches():
                # A batch comes at least every heartbeat interval (a heartbeat, if nothing else).
                if time.monotonic() - marked >= settings.OMNIGENT_STREAM_HEARTBEAT_S:
                    await mark_list_open()
                    marked = time.monotonic()
                chunks, ended = render(batch)
                if chunks:
                    yield b"".join(chunks)
                if ended:
                    return


def render(batch: list[dict[str, Any]]) -> tuple[list[bytes], bool]:
    """The frames for a batch of inbox messages, and whether the stream ends."""
    chunks: list[bytes] = []
    for message in batch:
        kind = message.get("type")
        if kind == "server.stop":
            chunks.append(DONE)
            return chunks, True
        if kind == "stream.heartbeat" and len(batch) == 1:
            chunks.append(frame({"type": "session.heartbeat"}))
        elif kind == "session.updates":
            chunks.append(str(message["frame"]).encode("utf-8"))
    return chunks, False
