"""Send a command to a runner's tunnel, wherever it is held, and wait for its answer.

The tunnel consumer records its channel name on the Runner row. A caller on any
server process sends the command to that channel with a reply channel of its own
and waits there, with a deadline, for the consumer to forward the runner's
``ack``, ``nack`` or ``rpc.result``. With channels-redis this crosses processes
unchanged; nothing assumes the caller holds the socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from omnigent_runner.protocol import (
    AnyCommand,
    ChannelMessage,
    ProtocolError,
    TunnelCommand,
    TunnelReply,
    channel_message,
    decode_channel_message,
)
from omnigent_site import metrics

from .tunnel_errors import nack_error

log = logging.getLogger(__name__)


class RelayError(Exception):
    """The command was not accepted: not delivered in time, tunnel gone, or nacked.

    ``status`` is set when the runner answered an rpc with an error and named the
    HTTP status for it (``workspace.*``); None for every delivery failure.
    """

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


# The code of a command given up because its tunnel is gone (``still_there``).
TUNNEL_GONE = "tunnel_gone"


async def _wait_for_reply(
    layer: Any,
    reply_channel: str,
    *,
    still_there: Callable[[], Awaitable[bool]] | None,
    probe_s: float,
) -> Any:
    """The reply; with ``still_there``, asked every ``probe_s`` while none came."""
    if still_there is None:
        return await layer.receive(reply_channel)
    receiving = asyncio.ensure_future(layer.receive(reply_channel))
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=probe_s)
            if done:
                return receiving.result()
            if not await still_there():
                raise RelayError(TUNNEL_GONE, "the runner's tunnel closed before it answered")
    finally:
        receiving.cancel()


async def send_command(
    *,
    channel_name: str,
    command: AnyCommand,
    timeout: float | None = None,
    still_there: Callable[[], Awaitable[bool]] | None = None,
    probe_s: float = 1.0,
) -> TunnelReply:
    """Deliver ``command`` (its ``id`` is set by the consumer) and return the runner's answer.

    Returns the ``tunnel.reply`` of an ack (its ``result`` for rpc). Raises
    :class:`RelayError` on a nack, a closed tunnel or a missed deadline.

    ``still_there``: asked every ``probe_s`` while no answer came; False gives up with
    ``tunnel_gone`` (the tunnel's consumer ended before the command reached it, as when
    its server process stops, and nothing would ever answer).
    """
    if not channel_name:
        raise RelayError("runner_offline", "the runner is not connected")
    deadline = settings.OMNIGENT_RELAY_TIMEOUT_S if timeout is None else timeout
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured in settings"
    started = time.perf_counter()
    try:
        reply_channel = await layer.new_channel()
        message = channel_message(TunnelCommand(command=command, reply_channel=reply_channel))
        async with asyncio.timeout(deadline):
            await layer.send(channel_name, message)
            raw_reply = await _wait_for_reply(
                layer, reply_channel, still_there=still_there, probe_s=probe_s
            )
    except RelayError:
        metrics.relay_answered(outcome="undelivered", seconds=time.perf_counter() - started)
        raise
    except TimeoutError:
        metrics.relay_answered(outcome="timeout", seconds=time.perf_counter() - started)
        raise RelayError(
            "runner_timeout", f"the runner did not acknowledge within {deadline:g} s"
        ) from None
    except Exception as exc:
        # A full or unreachable channel layer is a delivery failure, not a 500.
        log.warning("relay to %s failed: %s", channel_name, exc.__class__.__name__)
        metrics.relay_answered(outcome="undelivered", seconds=time.perf_counter() - started)
        metrics.backend_error("redis" if settings.REDIS_URL else "channel_layer")
        raise RelayError("relay_failed", "the command could not be delivered") from exc
    metrics.relay_answered(outcome="answered", seconds=time.perf_counter() - started)
    try:
        reply = decode_channel_message(raw_reply)
    except ProtocolError as exc:
        reply = None
        log.error("relay to %s: unreadable reply: %s", channel_name, exc)
    if not isinstance(reply, TunnelReply):
        raise RelayError("relay_failed", "the tunnel sent an unreadable reply")
    if reply.ok:
        return reply
    error = nack_error(reply.error)
    raise RelayError(error.code, error.message, status=reply.status)


async def post_command(*, channel_name: str, command: AnyCommand) -> None:
    """Fire-and-forget ``command`` to a runner's tunnel: nobody waits for its answer."""
    await notify(channel_name=channel_name, message=TunnelCommand(command=command))


async def notify(*, channel_name: str, message: ChannelMessage) -> None:
    """Fire-and-forget message to a tunnel consumer (close it, forward a command, reply)."""
    if not channel_name:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.send(channel_name, channel_message(message))
    except Exception:
        log.warning("could not notify %s", channel_name, exc_info=True)
