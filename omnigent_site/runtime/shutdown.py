"""Let open streams end cleanly (``data: [DONE]``) when the server is asked to stop.

On SIGTERM or SIGINT Twisted stops its reactor. First of all this process stops
listening (``stop_listening``): a proxy in front gets a refused connection and sends
new requests to the other processes, while the requests already here finish. Daphne, from its own
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
  ``drain_s()`` plus their unwinding). Twisted closes no connection before every
  before-shutdown Deferred has fired.
- ``DrainOnShutdown`` runs each HTTP request in a task of its own. When daphne
  cancels a request while the server is stopping, the request is given up to
  ``drain_s()`` (``OMNIGENT_SHUTDOWN_DRAIN_S``) to end by itself before it is cancelled. Outside a shutdown a
  cancellation goes through at once, as before.

Both triggers run in the same reactor turn and a cancellation is delivered only at
the request's next step, so the order in which they were registered does not
matter. (This replaces wrapping the process's SIGTERM and SIGINT handlers.)
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from collections.abc import Sequence
from typing import Any

from asgiref.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from omnigent_site.runtime import background

log = logging.getLogger(__name__)

# How long no request may be in flight before the drain counts as over.
QUIET_S = 0.2

# Longest the before-shutdown trigger waits for requests: their drain, then the
# unwinding of those that had to be cancelled.
UNWIND_S = 2.0

_events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = (
    weakref.WeakKeyDictionary()
)
_requests: set[asyncio.Future[Any]] = set()
_stopping = False


def drain_s() -> float:
    """How long a request in flight may go on once the process stops: a message
    waits for its runner's acknowledgement (``OMNIGENT_RELAY_TIMEOUT_S``) and, when the
    runner's tunnel moved, for its reconnection."""
    from django.conf import settings

    return float(settings.OMNIGENT_SHUTDOWN_DRAIN_S)


def stop_listening() -> int:
    """Close this process's listening sockets (daphne's HTTP ports); return how many.

    Twisted closes them only in the "during" phase of its shutdown, after every
    before-shutdown trigger: until then new connections would still be accepted, and
    cut off when the drain ends. Found through the reactor's public list of readers.
    """
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or not hasattr(reactor, "getReaders"):
        return 0
    from daphne.http_protocol import HTTPFactory
    from twisted.internet.interfaces import IListeningPort

    stopped = 0
    for reader in list(reactor.getReaders()):
        factory = getattr(reader, "factory", None)
        if IListeningPort.providedBy(reader) and isinstance(factory, HTTPFactory):
            reader.stopListening()
            stopped += 1
    if stopped:
        log.info("stopping: no longer listening; %d requests in flight may finish", len(_requests))
    return stopped


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
    flight have ended (``_drain``), or ``None`` when there is no running loop to wait on.
    """
    global _stopping
    _stopping = True
    stop_listening()
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
    hooks = background.start_stop_hooks()
    from twisted.internet import defer

    return defer.Deferred.fromFuture(asyncio.ensure_future(_drain(hooks)))


async def _drain(hooks: Sequence[asyncio.Future[Any]]) -> None:
    """Until the stop hooks have run and no HTTP request is in flight, for at most
    ``drain_s()`` plus the unwinding.

    Requests that arrive after the stop began are waited for too: they come on
    connections a proxy had kept alive (new connections are refused), and Twisted
    closes every connection once this returns. A short quiet spell confirms the end,
    since such a request may be on its way when the last one ends.
    """
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + drain_s() + UNWIND_S
    if hooks:
        await asyncio.wait(hooks, timeout=max(0.0, deadline - loop.time()))
    while loop.time() < deadline:
        in_flight = [request for request in _requests if not request.done()]
        if in_flight:
            await asyncio.wait(in_flight, timeout=max(0.0, deadline - loop.time()))
            continue
        await asyncio.sleep(min(QUIET_S, max(0.0, deadline - loop.time())))
        if not any(not request.done() for request in _requests):
            log.info("stopping: drained in %.1f s", loop.time() - began)
            return
    left = sum(1 for request in _requests if not request.done())
    log.warning("stopping: %d requests still in flight after %.1f s", left, loop.time() - began)


async def finish_or_cancel(request: asyncio.Future[Any]) -> None:
    """``request``'s caller was cancelled: let it end by itself if the server is stopping
    (for up to ``drain_s()``), otherwise cancel it; return once it is over."""
    if _stopping and not request.done():
        await asyncio.wait({request}, timeout=drain_s())
    if not request.done():
        request.cancel()
    try:
        await request
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("a request failed while it was being stopped")


class DrainOnShutdown:
    """ASGI middleware: a stopping server lets HTTP requests finish (see the module),
    and runner tunnels (WebSocket) end by themselves: a tunnel consumer closes its
    connection as a restart and, until its ``disconnect`` has run, answers the commands
    still sent to it with ``tunnel_closed``, which their callers send again on the
    runner's next tunnel. Cancelled at once, it would leave those commands unanswered
    until their deadline."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] not in ("http", "websocket"):
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
