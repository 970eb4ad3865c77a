"""Know whether an HTTP client is keeping up with a streamed response.

Daphne writes every body chunk into Twisted's transport buffer without ever
making the application wait, so a client that stops reading would make the
server buffer without bound. Twisted does tell a registered *push producer*
when the socket's buffer fills (``pauseProducing``) and drains
(``resumeProducing``). ``WriteWatch`` is such a producer: the SSE stream
registers it and stops (with a final event) once a paused client falls too far
behind. Outside daphne there is no request protocol to watch and the watch
reports the client as always keeping up.

Daphne offers no public way to reach the request: its ``send`` is
``functools.partial(server.handle_reply, protocol)``, and the protocol (Twisted's
``Request``) is its first argument. The guard test checks that shape, so a daphne
upgrade that changes it fails a test rather than silently turning backpressure off.
"""

from __future__ import annotations

import functools
from typing import Any

from asgiref.typing import ASGIReceiveCallable, ASGISendCallable, Scope

SCOPE_KEY = "omnigent.write_watch"


class WriteWatch:
    def __init__(self, request_protocol: Any | None) -> None:
        self._protocol = request_protocol
        self._registered = False
        self.paused = False

    def start(self) -> None:
        protocol = self._protocol
        if protocol is None or self._registered or getattr(protocol, "producer", None):
            return
        try:
            protocol.registerProducer(self, True)
            self._registered = True
        except (RuntimeError, ValueError, AttributeError):
            self._protocol = None

    def stop(self) -> None:
        if self._registered and self._protocol is not None:
            self._registered = False
            try:
                self._protocol.unregisterProducer()
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass

    # IPushProducer, called by Twisted on the reactor (event loop) thread.
    def pauseProducing(self) -> None:  # noqa: N802
        self.paused = True

    def resumeProducing(self) -> None:  # noqa: N802
        self.paused = False

    def stopProducing(self) -> None:  # noqa: N802
        self.paused = True


def _request_protocol(send: Any) -> Any | None:
    """Daphne passes ``partial(server.handle_reply, protocol)`` as ``send``."""
    if isinstance(send, functools.partial) and send.args:
        candidate = send.args[0]
        if hasattr(candidate, "registerProducer") and hasattr(candidate, "unregisterProducer"):
            return candidate
    return None


class WriteWatchMiddleware:
    """ASGI middleware that offers each HTTP request a :class:`WriteWatch` in its scope."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http":
            scope = {**scope, SCOPE_KEY: WriteWatch(_request_protocol(send))}  # type: ignore[assignment]
        await self.app(scope, receive, send)
