"""Failing the busy sessions of runners that vanished with their server process.

A tunnel's grace timer runs in the process that held the tunnel. If that process
dies, the Runner row still names its channel and nobody fails the runner's busy
sessions. Every server process therefore sweeps now and then
(``services.fail_stale_runners``): from a process-wide loop
(``sweep_stale_runners_forever``, registered with ``omnigent_site.runtime.on_serve``
in ``RunnersConfig.ready`` and started with the server's reactor however daphne
was started), whether or not the process holds any tunnel, and from each tunnel's
heartbeat. All callers share one rate limit.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from . import services

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
