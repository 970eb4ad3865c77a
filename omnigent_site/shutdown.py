"""Let open streams end cleanly (``data: [DONE]``) when the server is asked to stop.

Daphne stops its reactor on SIGTERM/SIGINT and cancels running requests, which
would cut SSE streams without their final frame. The first stream request wraps
the process's SIGTERM and SIGINT handlers: the signal first sets the
:func:`stopping` event of every running loop so streams write ``[DONE]``, then,
a moment later, the original handler runs and the server stops as before.
"""

from __future__ import annotations

import asyncio
import signal
import weakref
from typing import Any

DRAIN_S = 0.5

_events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = (
    weakref.WeakKeyDictionary()
)
_installed = False


def stopping() -> asyncio.Event:
    """An event (of the running loop) set when the process receives SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    event = _events.get(loop)
    if event is None:
        event = _events[loop] = asyncio.Event()
    _install(loop)
    return event


def _install(loop: asyncio.AbstractEventLoop) -> None:
    global _installed
    if _installed:
        return
    _installed = True
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            signal.signal(signum, _wrap(previous))
        except ValueError:
            # Not the main thread (a test server, say): streams end on cancellation only.
            return


def _wrap(previous: Any) -> Any:
    def handler(received: int, frame: Any) -> None:
        running = [(loop, event) for loop, event in list(_events.items()) if not loop.is_closed()]
        for loop, event in running:
            loop.call_soon_threadsafe(event.set)
        later = previous if callable(previous) else _default_exit
        if previous == signal.SIG_IGN:
            return
        if running:
            loop = running[-1][0]
            loop.call_soon_threadsafe(loop.call_later, DRAIN_S, later, received, frame)
        else:
            later(received, frame)

    return handler


def _default_exit(signum: int, frame: Any = None) -> None:
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
