"""Process-wide background tasks that every server process runs while it serves.

Daphne sends no ASGI lifespan events, so nothing tells the application that a
server process has started. Apps register their loops here (``on_serve``, from
their ``AppConfig.ready``), and ``runtime.server`` starts them on the server's
event loop once Twisted's reactor runs, whichever way daphne was started. The
registry lets ``omnigent_site`` start a loop that belongs to another app without
importing it (apps depend in one direction: ``runners`` -> ``omnigent_site``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]

_factories: dict[str, TaskFactory] = {}
_tasks: set[asyncio.Task[None]] = set()
_started = False


def on_serve(factory: TaskFactory) -> TaskFactory:
    """Run ``factory()`` as a task for the life of every server process.

    Registering the same function again (``ready()`` may run more than once in
    tests) replaces it instead of adding a second loop. Returns ``factory``, so it
    can be used as a decorator.
    """
    _factories[f"{factory.__module__}.{factory.__qualname__}"] = factory
    return factory


def registered() -> list[str]:
    """Names of the registered loops, in registration order."""
    return list(_factories)


def start_background_tasks() -> list[asyncio.Task[None]]:
    """Start every registered loop on the running event loop, once per process.

    A loop that ends with an error is logged; it is not restarted (each loop is
    expected to catch its own errors and keep going).
    """
    global _started
    if _started:
        return []
    _started = True
    loop = asyncio.get_running_loop()
    started = []
    for name, factory in _factories.items():
        task = loop.create_task(factory(), name=name)
        _tasks.add(task)
        task.add_done_callback(_finished)
        started.append(task)
    return started


def _finished(task: asyncio.Task[None]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s stopped", task.get_name(), exc_info=task.exception())
