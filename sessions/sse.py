"""What every Server-Sent Events stream of the API shares: a channel in a channel-layer
group feeding one inbox, heartbeats, and ``[DONE]`` when the server stops.

The session stream (``stream.py``) and the session-list stream (``updates_stream.py``)
differ only in what they send before the live tail and how they render a batch; both
follow their group through a ``GroupFeed``. One inbox takes everything that can wake a
stream: group messages (moved by a pump task), the server stopping, and the heartbeat
timer. Whatever has piled up is handed over as one batch, so a busy stream costs one
write per batch, not one per event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from omnigent_site.runtime.shutdown import stopping

from .eventlog import sse_frame

log = logging.getLogger(__name__)

INBOX_SIZE = 1000
DONE = b"data: [DONE]\n\n"
HEARTBEAT: dict[str, Any] = {"type": "stream.heartbeat"}
SERVER_STOP: dict[str, Any] = {"type": "server.stop"}
# A stream joins its group again this often: channel layers drop group members after
# ``group_expiry`` (a day by default), and a stream may stay open longer.
GROUP_REFRESH_S = 3600.0

Inbox = asyncio.Queue[dict[str, Any]]


def frame(payload: Mapping[str, Any], *, seq: int | None = None) -> bytes:
    return sse_frame(payload, seq=seq).encode("utf-8")


def _offer(inbox: Inbox, message: dict[str, Any]) -> None:
    """Put without waiting; a full inbox already has something to wake the stream."""
    try:
        inbox.put_nowait(message)
    except asyncio.QueueFull:
        pass


async def _pump(layer: Any, channel: str, inbox: Inbox) -> None:
    """Move group messages into the inbox (a full inbox holds the layer's channel back;
    what the layer then drops is read back from the log by the session stream)."""
    while True:
        await inbox.put(await layer.receive(channel))


async def _on_stop(inbox: Inbox) -> None:
    await stopping().wait()
    while True:
        try:
            inbox.put_nowait(SERVER_STOP)
            return
        except asyncio.QueueFull:
            inbox.get_nowait()  # make room: the stream ends anyway


class GroupFeed:
    """Membership of one channel-layer group for the life of one stream.

    ``async with GroupFeed(group) as feed`` joins the group before the body does
    anything else, so nothing published after that is missed; ``feed.batches()`` then
    yields what arrived, a lone ``HEARTBEAT`` after ``OMNIGENT_STREAM_HEARTBEAT_S`` of
    silence, and ``SERVER_STOP`` when the server shuts down. Leaving cancels the tasks
    and the group membership, also when the client went away.
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self.inbox: Inbox = asyncio.Queue(maxsize=INBOX_SIZE)
        self._layer: Any = None
        self._channel = ""
        self._tasks: list[asyncio.Future[None]] = []
        self._heartbeat: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> GroupFeed:
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS is configured in settings"
        self._layer = layer
        self._channel = await layer.new_channel()
        await layer.group_add(self.group, self._channel)
        self._tasks = [
            asyncio.ensure_future(_pump(layer, self._channel, self.inbox)),
            asyncio.ensure_future(_on_stop(self.inbox)),
        ]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for task in self._tasks:
            task.cancel()
        try:
            await asyncio.shield(self._layer.group_discard(self.group, self._channel))
        except Exception:  # noqa: BLE001 - the group entry expires on its own
            log.debug("could not leave %s", self.group, exc_info=True)

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        joined = time.monotonic()
        while True:
            if time.monotonic() - joined > GROUP_REFRESH_S:
                await self._layer.group_add(self.group, self._channel)
                joined = time.monotonic()
            self._heartbeat = loop.call_later(
                settings.OMNIGENT_STREAM_HEARTBEAT_S, _offer, self.inbox, HEARTBEAT
            )
            batch = [await self.inbox.get()]
            self._heartbeat.cancel()
            while not self.inbox.empty():
                batch.append(self.inbox.get_nowait())
            yield batch
