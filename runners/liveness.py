"""Which server process holds each runner's tunnel, and whether that process is alive.

A runner is online only while a tunnel is connected to some server process
(tunnel.md, Liveness). The Runner row names the consumer's channel and the process
that holds it (``tunnel_process``, this module's ``PROCESS_ID``). Each process keeps a
liveness mark, ``process:<id>``, in the ``presence`` cache (Redis when scaled out,
shared by every process; else this process's own memory), renewed every
``OMNIGENT_PROCESS_BEAT_S`` and lasting three of them. So:

- **Clean stop** (``on_stop``): the process drops its mark and marks every tunnel it
  holds offline, before its connections close.
- **Start** (``on_start``, before the first request): the process puts its mark and
  marks offline every tunnel held by a process that has none. A process on its own
  (no Redis) sees no other process's mark, so the tunnels its predecessor held,
  stopped or crashed, read offline before anything is served, while their runners
  still back off.
- **Crash, scaled out**: the dead process's mark lapses after three beats; the next
  beat of any process marks its tunnels offline (their busy sessions then go through
  the reconnect grace as after any drop: ``upkeep``).
- **A mark lost while the process lives** (Redis emptied): the process puts it back
  and sets its own tunnels online again, in case another process had found them dead.

A cache that cannot be read marks nothing offline.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import caches
from django.db import connections

from . import services

log = logging.getLogger(__name__)

PROCESS_ID = f"srv_{secrets.token_hex(8)}"

# The tunnels this process holds: channel name -> (runner id, connection generation).
_held: dict[str, tuple[str, int]] = {}


def beat_s() -> float:
    return float(settings.OMNIGENT_PROCESS_BEAT_S)


def mark_ttl_s() -> float:
    """How long a mark outlives its last renewal: three beats."""
    return 3 * beat_s()


def mark_key(process_id: str) -> str:
    return f"process:{process_id}"


def hold(*, channel_name: str, runner_id: str, generation: int) -> None:
    """The consumer on ``channel_name`` holds the runner's tunnel (after ``hello``)."""
    _held[channel_name] = (runner_id, generation)


def let_go(*, channel_name: str) -> None:
    _held.pop(channel_name, None)


def _renew_mark() -> bool:
    """Renew this process's mark; False when it had lapsed (and is now put back)."""
    cache = caches["presence"]
    if cache.touch(mark_key(PROCESS_ID), mark_ttl_s()):
        return True
    cache.set(mark_key(PROCESS_ID), 1, mark_ttl_s())
    return False


def sweep_dead_processes() -> list[str]:
    """Mark offline the tunnels of every process without a mark; their runner ids."""
    holders = services.tunnel_holders()
    others = [process for process in holders if process and process != PROCESS_ID]
    if not others:
        return []
    alive = caches["presence"].get_many([mark_key(process) for process in others])
    released: list[str] = []
    for process in others:
        if mark_key(process) not in alive:
            found = services.release_tunnels(process_id=process)
            if found:
                log.warning("server process %s is gone: runners offline: %s", process, found)
            released += found
    return released


def beat() -> None:
    """One beat: renew the mark (restoring this process's tunnels if it had lapsed),
    then look for dead processes."""
    if not _renew_mark() and _held:
        log.warning("this process's liveness mark had lapsed: restoring its tunnels")
        services.restore_tunnels(
            process_id=PROCESS_ID,
            held=[(channel, runner_id, gen) for channel, (runner_id, gen) in _held.items()],
        )
    sweep_dead_processes()


def start() -> None:
    """``on_start``: this process is alive, the tunnels of dead ones are not."""
    try:
        caches["presence"].set(mark_key(PROCESS_ID), 1, mark_ttl_s())
        sweep_dead_processes()
    except Exception:
        log.exception("could not mark the tunnels of stopped server processes offline")
    finally:
        # Run on the reactor's thread before its loop: leave no connection to it.
        connections.close_all()


async def stop() -> None:
    """``on_stop``: this process's tunnels go offline before its connections close."""
    try:
        await caches["presence"].adelete(mark_key(PROCESS_ID))
    except Exception:
        log.warning("could not drop this process's liveness mark", exc_info=True)
    released = await database_sync_to_async(services.release_tunnels)(process_id=PROCESS_ID)
    if released:
        log.info("stopping: runners offline: %s", ", ".join(released))


async def beat_forever() -> None:
    """The process-wide loop (``on_serve``): a beat every ``OMNIGENT_PROCESS_BEAT_S``."""
    while True:
        await asyncio.sleep(beat_s())
        try:
            await database_sync_to_async(beat)()
        except Exception:
            log.exception("liveness beat failed")
