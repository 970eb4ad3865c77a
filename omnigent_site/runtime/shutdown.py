"""Let open streams end cleanly (``data: [DONE]``) when the server is asked to stop.

On SIGTERM or SIGINT Twisted stops its reactor. Daphne, from its own
before-shutdown trigger, cancels every running application instance; it waits for
them with ``asyncio.gather``, which returns as soon as the first instance (a
tunnel, say) ends cancelled, and Twisted then closes the connections. A cancelled
SSE stream would end without its final frame. So:

- ``begin`` is a before-shutdown trigger of the reactor
  (``reactor.addSystemEventTrigger("before", "shutdown", ...)``, registered by
  ``runtime.server``): it sets the :func:`stopping` event of every loop, so the
  streams write ``[DONE]`` and end, starts the apps' ``on_stop`` hooks (the runners
  app marks the tunnels this process holds offline), and returns a Deferred that
  fires once those hooks and the HTTP requests in flight have ended (at most
  ``DRAIN_S`` plus their unwinding). Twisted closes no connection before every
  before-shutdown Deferred has fired.
- ``DrainOnShutdown`` runs each HTTP request in a task of its own. When daphne
  cancels a request while the server is stopping, the request is given up to
  ``DRAIN_S`` to end by itself before it is cancelled. Outside a shutdown a
  cancellation goes through at once, as before.

Both triggers run in the same reactor turn and a cancellation is delivered only at
the request's next step, so the order in which they were registered does not
matter. (This replaces wrapping the process's SIGTERM and SIGINT handlers.)
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from asgiref.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from omnigent_site.runtime import background

log = logging.getLogger(__name__)

DRAIN_S = 0.5

# Longest the before-shutdown trigger waits for requests: their drain, then the
# unwinding of those that had to be cancelled.
UNWIND_S = 2.0

_events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = (
    weakref.WeakKeyDictionary()
)
_requests: set[asyncio.Future[Any]] = set()
_stopping = False


def stopping() -> asyncio.Event:
    """An event (of the running loop), set once the server process begins to stop."""
    loop = asyncio.get_running_loop()
    event = _events.get(loop)
    if event is None:
        event = _events[loop] = asyncio.Event()
        if _stopping:
            event.set()
    return event


def begin() -> Any:
    """The server is stopping: wake every stream and run the ``on_stop`` hooks (a
    before-shutdown trigger).

    Returns a Twisted Deferred that fires once the hooks and the HTTP requests in
    flight have ended, or ``None`` when there are none (or no running loop to wait on).
    """
    global _stopping
    _stopping = True
    try:
        current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    for loop, event in list(_events.items()):
        if loop is current:
            event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(event.set)
    if current is None:
        return None
    waited: list[asyncio.Future[Any]] = [request for request in _requests if not request.done()]
    waited += background.start_stop_hooks()
    if not waited:
        return None
    from twisted.internet import defer

    return defer.Deferred.fromFuture(
        asyncio.ensure_future(asyncio.wait(waited, timeout=DRAIN_S + UNWIND_S))
    )


async def finish_or_cancel(request: asyncio.Future[Any]) -> None:
    """``request``'s caller was cancelled: let it end by itself if the server is stopping
    (for up to ``DRAIN_S``), otherwise cancel it; return once it is over."""
    if _stopping and not request.done():
        await asyncio.wait({request}, timeout=DRAIN_S)
    if not request.done():
        request.cancel()
    try:
        await request
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("a request failed while it was being stopped")


class DrainOnShutdown:
    """ASGI middleware: a stopping server lets HTTP requests finish (see the module)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = asyncio.ensure_future(self.app(scope, receive, send))
        _requests.add(request)
        request.add_done_callback(_requests.discard)
        try:
            await asyncio.shield(request)
        except asyncio.CancelledError:
            await finish_or_cancel(request)
            raise
