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
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)


class RelayError(Exception):
    """The command was not accepted: not delivered in time, tunnel gone, or nacked."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def send_command(
    *, channel_name: str, command: dict[str, Any], timeout: float | None = None
) -> dict[str, Any]:
    """Deliver ``command`` (a frame without ``id``) and return the runner's answer.

    Returns ``{"ok": True, "result": ...}`` for an ack (``result`` for rpc). Raises
    :class:`RelayError` on a nack, a closed tunnel or a missed deadline.
    """
    if not channel_name:
        raise RelayError("runner_offline", "the runner is not connected")
    deadline = settings.OMNIGENT_RELAY_TIMEOUT_S if timeout is None else timeout
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is configured in settings"
    reply_channel = await layer.new_channel()
    try:
        async with asyncio.timeout(deadline):
            await layer.send(
                channel_name,
                {"type": "tunnel.command", "command": command, "reply_channel": reply_channel},
            )
            reply = await layer.receive(reply_channel)
    except TimeoutError:
        raise RelayError(
            "runner_timeout", f"the runner did not acknowledge within {deadline:g} s"
        ) from None
    except Exception as exc:
        # A full or unreachable channel layer is a delivery failure, not a 500.
        log.warning("relay to %s failed: %s", channel_name, exc.__class__.__name__)
        raise RelayError("relay_failed", "the command could not be delivered") from exc
    if reply.get("ok"):
        return reply
    error = reply.get("error") or {}
    raise RelayError(
        str(error.get("code") or "rejected"),
        str(error.get("message") or "the runner rejected the command"),
    )


async def notify(*, channel_name: str, message: dict[str, Any]) -> None:
    """Fire-and-forget message to a tunnel consumer (close it, forward a command)."""
    if not channel_name:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.send(channel_name, message)
    except Exception:
        log.warning("could not notify %s", channel_name, exc_info=True)
