"""The event loop daphne runs on: uvloop, when ``python -m omnigent_site.serve`` starts it.

Everything the server does on its event loop (Twisted's reactor, Django's handler,
the Channels consumers, every hand-over to and from a request's thread) goes through
the loop's scheduling, and uvloop's is native code where asyncio's own is Python (the
gain is in ``docs/performance.md``, overrides). Twisted's
asyncio reactor takes any loop that offers readers, writers, timers and thread-safe
calls, which uvloop does.

Daphne creates its loop, and installs Twisted's reactor on it, when ``daphne.server``
is imported, which its command line does before it imports the application. So the
loop can only be chosen by the launcher, before that import, through asyncio's public
event-loop policy: :func:`install_event_loop` is called by ``omnigent_site.serve``. A
bare ``daphne omnigent_site.asgi:application`` keeps asyncio's own loop and behaves
the same, only slower; the runtime's start-up line names the loop either way
(``runtime/server.py``).

This module imports neither Django nor daphne: it runs before either is loaded.
"""

from __future__ import annotations

import asyncio
from typing import Any

# OMNIGENT_EVENT_LOOP: ``auto`` is uvloop where it is installed (requirements.txt
# installs it everywhere but Windows, which it does not support), else asyncio's.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


class EventLoopChoiceError(ValueError):
    """``OMNIGENT_EVENT_LOOP`` names no loop this process can run."""


def install_event_loop(choice: str) -> str:
    """Make new event loops the ones ``choice`` names; return ``"uvloop"`` or ``"asyncio"``.

    Call it before ``daphne.server`` is imported. ``choice`` is the value of
    ``OMNIGENT_EVENT_LOOP`` (blank means ``auto``); anything else, or ``uvloop`` where it
    is not installed, raises :class:`EventLoopChoiceError` with what to set instead.
    """
    value = choice.strip().lower() or "auto"
    if value not in EVENT_LOOPS:
        raise EventLoopChoiceError(
            f"OMNIGENT_EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, not {choice!r}"
        )
    if value == "asyncio":
        return "asyncio"
    try:
        import uvloop
    except ImportError:
        if value == "uvloop":
            raise EventLoopChoiceError(
                "OMNIGENT_EVENT_LOOP is uvloop, but uvloop is not installed: install it "
                "(requirements.txt) or set OMNIGENT_EVENT_LOOP=asyncio"
            ) from None
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def loop_name(loop: Any) -> str:
    """``"uvloop"`` or ``"asyncio"``: which implementation ``loop`` is."""
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
