"""``manage.py deliverwebhooks``: a process that only sends webhook deliveries.

Run it beside the server processes with ``OMNIGENT_WEBHOOK_DELIVERY=worker``
(docs/automation.md, "Where deliveries are sent"): the server processes then only write
the events and wake the workers through the channel layer, and the CPU of sending goes
here. Any number may run; each attempt is claimed by one. SIGTERM or Ctrl-C stops it
after the attempts in flight (up to a second) are recorded; an attempt cut short is
sent again once its claim expires.

It runs at the servers' CPU priority: on SQLite a worker at a lower one (``nice 10``)
was descheduled while it held the database's write lock, and the servers' writes waited
for it (the throughput benchmark's second round: 52 and 38 turns/s against 64 and 50 at
the same priority, alternating runs; docs/performance-history.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from omnigent_site.runtime.event_loop import EventLoopChoiceError, install_event_loop
from webhooks import delivery

log = logging.getLogger("webhooks.worker")


class Command(BaseCommand):
    help = (
        "Send webhook deliveries until stopped; run beside the server processes with "
        "OMNIGENT_WEBHOOK_DELIVERY=worker."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            install_event_loop(os.environ.get("OMNIGENT_EVENT_LOOP", ""))
        except EventLoopChoiceError as exc:
            raise CommandError(str(exc)) from None
        poll_s = float(settings.OMNIGENT_WEBHOOK_POLL_S)
        if settings.OMNIGENT_WEBHOOK_DELIVERY != "worker":
            log.warning(
                "OMNIGENT_WEBHOOK_DELIVERY is %r: the server processes deliver as well",
                settings.OMNIGENT_WEBHOOK_DELIVERY,
            )
        log.info("delivering webhooks")
        asyncio.run(_deliver_until_stopped(poll_s=poll_s))
        log.info("stopped delivering webhooks")


async def _deliver_until_stopped(*, poll_s: float) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await delivery.deliver_as_worker(delivery.Worker(), poll_s=poll_s)
    except asyncio.CancelledError:
        pass
