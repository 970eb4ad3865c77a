"""Process-wide background tasks that every server process runs while it serves, and
what it does once as it starts and as it stops.

Daphne sends no ASGI lifespan events, so nothing tells the application that a
server process has started. Apps register their loops here (``on_serve``, from
their ``AppConfig.ready``), and ``runtime.server`` starts them on the server's
event loop once Twisted's reactor runs, whichever way daphne was started. The
registry lets ``omnigent_site`` start a loop that belongs to another app without
importing it (apps depend in one direction: ``runners`` -> ``omnigent_site``).

``on_start`` hooks run once when the reactor starts, before the event loop serves
anything (synchronously: no loop runs yet, so they may use the database directly).
``on_stop`` hooks run on the event loop when a clean stop begins
(``runtime.shutdown.begin``), which waits for them as it waits for the requests in
flight.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]
StartHook = Callable[[], None]

_factories: dict[str, TaskFactory] = {}
_start_hooks: dict[str, StartHook] = {}
_stop_hooks: dict[str, TaskFactory] = {}
_tasks: set[asyncio.Task[None]] = set()
_started = False


def on_serve(factory: TaskFactory) -> TaskFactory:
    """Run ``factory()`` as a task for the life of every server process.

    Registering the same function again (``ready()`` may run more than once in
    tests) replaces it instead of adding a second loop. Returns ``factory``, so it
    can be used as a decorator.
    """
    _factories[_name(factory)] = factory
    return factory


def on_start(hook: StartHook) -> StartHook:
    """Run ``hook()`` once in every server process as it starts, before it serves."""
    _start_hooks[_name(hook)] = hook
    return hook


def on_stop(hook: TaskFactory) -> TaskFactory:
    """Run ``hook()`` on the event loop when the server process begins a clean stop."""
    _stop_hooks[_name(hook)] = hook
    return hook


def _name(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def run_start_hooks() -> None:
    """The ``on_start`` hooks, in registration order; one that fails is logged."""
    for name, hook in _start_hooks.items():
        try:
            hook()
        except Exception:
            log.exception("start hook %s failed", name)


def start_stop_hooks() -> list[asyncio.Task[None]]:
    """The ``on_stop`` hooks as tasks on the running loop (the caller waits for them).

    Each runs in a fresh context: the stop begins inside whatever callback the reactor
    was running, and a request's context (its ``ThreadSensitiveContext``, already left)
    would make every ``sync_to_async`` call of the hook fail.
    """
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(hook(), name=name, context=contextvars.Context())
        for name, hook in _stop_hooks.items()
    ]
    for task in tasks:
        task.add_done_callback(_stop_hook_finished)
    return tasks


def _stop_hook_finished(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("stop hook %s failed", task.get_name(), exc_info=task.exception())


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
