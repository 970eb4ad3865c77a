"""Firing a claimed run: the same services a client's requests go through
(``POST /v1/sessions``, ``PATCH …runner_id``, ``POST …/events``), then waiting for the
runner's acknowledgement on the event loop, as the events view does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async

from omnigent_site.domain_errors import DomainError
from runners import dispatch

from . import clock, services

log = logging.getLogger(__name__)

ToThread = Callable[[Callable[..., Any]], Callable[..., Any]]


async def fire(run_id: str, *, to_thread: ToThread | None = None) -> None:
    """Start the run ``run_id`` (claimed, ``running``); never raises.

    ``to_thread`` runs the database work: Channels' ``database_sync_to_async`` in the
    firing loop (connections closed when old, as in a consumer), asgiref's
    ``sync_to_async`` in a request, whose handler looks after its connection.
    """
    to_thread = to_thread or database_sync_to_async
    try:
        plan = await to_thread(services.prepare_fire)(run_id=run_id, now=clock.now())
        if plan is None:
            return
        await dispatch.deliver_message(session=plan.session, accepted=plan.accepted)
    except DomainError as exc:
        await _fail(run_id, exc.message, to_thread)
    except Exception:
        log.exception("scheduled run %s failed to start", run_id)
        await _fail(run_id, "internal error while starting the run", to_thread)


async def _fail(run_id: str, error: str, to_thread: ToThread) -> None:
    try:
        await to_thread(services.fail_run)(run_id=run_id, error=error, now=clock.now())
    except Exception:
        log.exception("could not record the failure of scheduled run %s", run_id)
