"""The firing loop every server process runs (registered in ``SchedulesConfig.ready``
with ``omnigent_site.runtime.on_serve``, like the runners' sweeps).

Each pass claims the occurrences due now (``services.claim_due``: a row per occurrence,
so each fires once however many processes run this loop), fires the claimed ones as
tasks of their own, and settles runs whose turn ended. Between passes it sleeps until
the earliest ``next_run_at``, at most ``OMNIGENT_SCHEDULE_POLL_S``, so an occurrence
fires within a few milliseconds of its time when this process knew of it, and within
the poll interval of a task created or changed through another process.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from channels.db import database_sync_to_async
from django.conf import settings

from runners import liveness

from . import clock, firing, services

log = logging.getLogger(__name__)

_fires: set[asyncio.Task[None]] = set()
# Fires in flight at once in one process: a burst of occurrences due together (a
# hundred tasks at 02:00) reaches the runners a few at a time instead of all at once,
# where each would wait on the same runner and the same rows.
FIRE_CONCURRENCY = 8
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def _fire(run_id: str) -> None:
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(FIRE_CONCURRENCY)
    async with gate:
        await firing.fire(run_id)


async def fire_due() -> list[str]:
    """One pass: settle finished runs, then claim each due task and start its fire at
    once (a fire does not wait for the claims of the other tasks due with it)."""
    now = clock.now()
    # Settled first, so a run whose turn just ended does not skip the next occurrence.
    await database_sync_to_async(services.settle_runs)(now=now)
    claimed = []
    for task_id in await database_sync_to_async(services.due_task_ids)(now=now):
        run_id = await database_sync_to_async(services.claim_task)(
            task_id=task_id,
            now=now,
            grace_s=settings.OMNIGENT_SCHEDULE_GRACE_S,
            process_id=liveness.PROCESS_ID,
        )
        if run_id is None:
            continue
        claimed.append(run_id)
        task = asyncio.get_running_loop().create_task(_fire(run_id), name=f"fire {run_id}")
        _fires.add(task)
        task.add_done_callback(_fires.discard)
    return claimed


async def fire_due_forever() -> None:
    """The process-wide loop, until cancelled."""
    poll = settings.OMNIGENT_SCHEDULE_POLL_S
    while True:
        delay = poll
        try:
            await fire_due()
            delay = await database_sync_to_async(services.seconds_until_due)(
                now=clock.now(), cap=poll
            )
        except Exception:
            log.exception("scheduled tasks: the firing pass failed")
        await asyncio.sleep(max(delay, 0.005))
