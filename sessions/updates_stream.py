"""One subscriber's ``GET /v1/sessions/updates`` stream (design in ``sessions/updates.py``).

The same frame rules as the session stream: a ``session.heartbeat`` on connect and
after ``OMNIGENT_STREAM_HEARTBEAT_S`` without a message, ``data: [DONE]`` when the
server shuts down, ``session.resync`` when the client resumes (``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from omnigent_site.runtime.shutdown import stopping

from .stream import DONE, GROUP_REFRESH_S, HEARTBEAT, INBOX_SIZE, _offer, _on_stop, _pump, frame
from .updates import user_group

log = logging.getLogger(__name__)


class UpdatesStream:
    """Iterate it for the response body."""

    def __init__(self, *, user_pk: int, resumed: bool) -> None:
        self.user_pk = user_pk
        self.resumed = resumed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS is configured in settings"
        channel = await layer.new_channel()
        group = user_group(self.user_pk)
        # Joined before anything is sent: a client that reloads its list on the first
        # frame misses nothing written after that.
        await layer.group_add(group, channel)
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=INBOX_SIZE)
        pump = asyncio.ensure_future(_pump(layer, channel, inbox))
        shutdown = asyncio.ensure_future(_on_stop(inbox))
        heartbeat: asyncio.TimerHandle | None = None
        try:
            yield frame({"type": "session.heartbeat"})
            if self.resumed:
                yield frame({"type": "session.resync"})
            if stopping().is_set():
                yield DONE
                return
            loop = asyncio.get_running_loop()
            joined = time.monotonic()
            while True:
                if time.monotonic() - joined > GROUP_REFRESH_S:
                    await layer.group_add(group, channel)
                    joined = time.monotonic()
                heartbeat = loop.call_later(
                    settings.OMNIGENT_STREAM_HEARTBEAT_S, _offer, inbox, HEARTBEAT
                )
                batch = [await inbox.get()]
                heartbeat.cancel()
                while not inbox.empty():
                    batch.append(inbox.get_nowait())
                chunks, ended = render(batch)
                if chunks:
                    yield b"".join(chunks)
                if ended:
                    return
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            pump.cancel()
            shutdown.cancel()
            try:
                await asyncio.shield(layer.group_discard(group, channel))
            except Exception:  # noqa: BLE001 - the group entry expires on its own
                log.debug("could not leave %s", group, exc_info=True)


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
