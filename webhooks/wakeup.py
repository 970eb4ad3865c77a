"""Waking the delivery workers of other processes (``OMNIGENT_WEBHOOK_DELIVERY=worker``).

When deliveries are sent by ``manage.py deliverwebhooks`` processes, a server process
that committed an event tells them through the channel layer's group ``GROUP`` instead
of leaving the event to their next poll. It sends at most one wake-up per
``after_s`` (the events committed meanwhile go with it), so a busy server pays one
``group_send`` per 50 ms, not one per event. A lost wake-up costs only latency: every
worker still polls (``OMNIGENT_WEBHOOK_POLL_S``). The embedded channel layer reaches no
other process, so there the workers find events by polling alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from channels.layers import InMemoryChannelLayer

from omnigent_site.runtime.channel_layer import group_may_have_members

log = logging.getLogger(__name__)

GROUP = "webhook-workers"
WAKE = {"type": "webhooks.wake"}
# Group membership expires after the layer's ``group_expiry`` (a day by default):
# a worker joins again well before that.
GROUP_REFRESH_S = 3600.0
# After a failed receive (Redis restarting), the listener tries again this much later.
RETRY_S = 1.0
LEAVE_DEADLINE_S = 2.0


def reaches_other_processes(layer: Any) -> bool:
    """Whether a group message can reach another process (Redis: yes; the embedded
    layer lives in one process)."""
    return not isinstance(layer, InMemoryChannelLayer)


class Relay:
    """A server process's side: ``wake_soon`` from the event loop's thread, one
    ``group_send`` ``after_s`` later for every call made meanwhile."""

    def __init__(self, layer: Any, *, after_s: float) -> None:
        self.layer = layer
        self.after_s = after_s
        self.pending = asyncio.Event()
        self.sent = 0

    def wake_soon(self) -> None:
        self.pending.set()

    async def run(self) -> None:
        while True:
            await self.pending.wait()
            await asyncio.sleep(self.after_s)
            self.pending.clear()
            if not group_may_have_members(self.layer, GROUP):
                continue
            try:
                await self.layer.group_send(GROUP, dict(WAKE))
            except Exception:
                # The workers' poll finds the events.
                log.warning("could not wake the webhook workers", exc_info=True)
            else:
                self.sent += 1


async def listen(
    layer: Any, on_wake: Callable[[], None], *, refresh_s: float = GROUP_REFRESH_S
) -> None:
    """A worker's side: call ``on_wake`` for each wake-up from any server process,
    until cancelled."""
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    log.info("webhook wake-ups: listening on the channel layer's group %s", GROUP)
    refresh = asyncio.get_running_loop().create_task(_stay_in_group(layer, channel, refresh_s))
    try:
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("webhook wake-ups: receive failed; polling meanwhile", exc_info=True)
                await asyncio.sleep(RETRY_S)
                continue
            if message.get("type") == WAKE["type"]:
                on_wake()
    finally:
        refresh.cancel()
        try:
            # Bounded: a stop must not wait for a Redis that is gone (the membership
            # then lapses with the group's expiry).
            await asyncio.wait_for(layer.group_discard(GROUP, channel), LEAVE_DEADLINE_S)
        except Exception:
            log.debug("could not leave %s", GROUP, exc_info=True)


async def _stay_in_group(layer: Any, channel: str, refresh_s: float) -> None:
    while True:
        await asyncio.sleep(refresh_s)
        try:
            await layer.group_add(GROUP, channel)
        except Exception:
            log.warning("webhook wake-ups: could not join %s again", GROUP, exc_info=True)
