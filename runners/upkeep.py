"""Failing the busy sessions of runners that vanished with their server process.

A tunnel's grace timer runs in the process that held the tunnel. If that process
dies, the Runner row still names its channel and nobody fails the runner's busy
sessions. Every server process therefore sweeps now and then
(``services.fail_stale_runners``): from a process-wide loop
(``sweep_stale_runners_forever``, registered with ``omnigent_site.runtime.on_serve``
in ``RunnersConfig.ready`` and started with the server's reactor however daphne
was started), whether or not the process holds any tunnel, and from each tunnel's
heartbeat. All callers share one rate limit.

The same way, every process sends again the ``turn.start`` of the turns on its own
tunnels that the runner never acknowledged (``resend_unacked_starts_forever``, every
``OMNIGENT_START_RESEND_S``): a command sent fire and forget can be lost while the
tunnel stays up, and the runner's next ``hello`` may be hours away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

from channels.db import database_sync_to_async
from django.conf import settings

from omnigent_runner.protocol import TurnStart

from . import liveness, services
from .relay import post_command

log = logging.getLogger(__name__)

_last_sweep = 0.0


def sweep_interval_s() -> float:
    return max(settings.OMNIGENT_RECONNECT_GRACE_S, settings.OMNIGENT_HEARTBEAT_S)


async def sweep_stale_runners() -> None:
    """Fail the busy sessions of stale runners, at most once per ``sweep_interval_s``."""
    global _last_sweep
    now = time.monotonic()
    if now - _last_sweep < sweep_interval_s():
        return
    _last_sweep = now
    try:
        failed = await database_sync_to_async(services.fail_stale_runners)()
    except Exception:
        log.exception("could not sweep stale runners")
        return
    if failed:
        log.warning("failed sessions of runners that vanished: %s", ", ".join(failed))


async def sweep_stale_runners_forever() -> None:
    """The process-wide loop: a sweep every ``sweep_interval_s``, until cancelled."""
    while True:
        await asyncio.sleep(sweep_interval_s())
        await sweep_stale_runners()


async def resend_unacked_starts(*, now: datetime | None = None) -> int:
    """One sweep: send again what ``services.unacked_starts_to_resend`` finds for this
    process's tunnels (``now``: the clock, for tests). Returns the ``turn.start``
    commands sent; never raises."""
    try:
        sends = await database_sync_to_async(services.unacked_starts_to_resend)(
            process_id=liveness.PROCESS_ID, now=now
        )
    except Exception:
        log.exception("could not look for unacknowledged turn.start commands")
        return 0
    sent = 0
    for channel_name, commands in sends:
        for command in commands:
            await post_command(channel_name=channel_name, command=command)
            sent += type(command) is TurnStart
    if sent:
        log.warning("sent again %d turn.start that no runner acknowledged", sent)
    return sent


async def resend_unacked_starts_forever() -> None:
    """The process-wide loop: a sweep every ``OMNIGENT_START_RESEND_S`` (none when it
    is 0), until cancelled."""
    interval = settings.OMNIGENT_START_RESEND_S
    if interval <= 0:
        return
    while True:
        await asyncio.sleep(interval)
        await resend_unacked_starts()
