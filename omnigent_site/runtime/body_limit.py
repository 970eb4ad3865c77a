"""Request bodies over a path's limit refused at the socket, before they are stored.

Twisted reads a whole HTTP request body before daphne hands the request to the
application: it writes it into ``Request.content`` (a temporary file past 100 kB),
then daphne replays it to Django, which spools it again
(``FILE_UPLOAD_MAX_MEMORY_SIZE`` in memory, then another temporary file). A limit
checked by the view or by an upload handler therefore comes after a 1 GB upload has
been received and written to disk twice. For the paths registered here
(``limit_request_body``, from an app's ``AppConfig.ready``) the request class checks
the body while it arrives instead:

- a ``Content-Length`` over the limit is refused as soon as the headers are in (no
  ``100 Continue`` is sent, so a client that waits for it sends nothing);
- a body without a length (chunked) is counted chunk by chunk and refused when the
  count passes the limit.

Refused means: a ``413`` in the API's error format with ``Connection: close`` is
written at once; whatever else the client sends is read and dropped (nothing is
kept, so memory stays flat) for at most ``LINGER_S`` so the client gets to read the
answer, then the connection is closed. The application never sees the request.
Every other path gets the default limit (``default_limit``): Django's own caps on a
body it would accept at all, so no API request body is stored whole before Django
refuses it.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from io import BytesIO
from typing import Any
from urllib.parse import unquote

log = logging.getLogger(__name__)

LINGER_S = 2.0

_limits: dict[str, tuple[re.Pattern[str], Callable[[], int]]] = {}


def limit_request_body(pattern: str, limit: Callable[[], int]) -> None:
    """Refuse bodies over ``limit()`` bytes on paths matching ``pattern`` (re.match).

    Registering a pattern again replaces its limit (``ready()`` may run twice).
    """
    _limits[pattern] = (re.compile(pattern), limit)


def limit_for(raw_target: bytes) -> int | None:
    """The body limit for a request target (path and query, as on the request line)."""
    # Decoded as daphne decodes it for the application (``unquote``), so a
    # percent-encoded spelling of a registered path is caught too.
    path = unquote(raw_target.split(b"?", 1)[0].decode("latin-1"))
    for compiled, limit in _limits.values():
        if compiled.match(path):
            return int(limit())
    return default_limit()


def default_limit() -> int | None:
    """The largest body Django takes on a path with no limit of its own.

    A JSON or form body is capped by ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and the file part
    of a multipart upload (a bundle) by the view, at ``FILE_UPLOAD_MAX_MEMORY_SIZE`` at
    most; 1 MiB on top leaves room for the framing. ``None`` (Django's "no limit")
    keeps it off.
    """
    from django.conf import settings

    data = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if data is None:
        return None
    return max(int(data), int(settings.FILE_UPLOAD_MAX_MEMORY_SIZE)) + 1024 * 1024


def refusal_bytes(limit: int) -> bytes:
    """The raw HTTP/1.1 413 response written on the socket."""
    from omnigent_site.errors import error_body
    from omnigent_site.renderers import json_bytes

    body = json_bytes(
        error_body(413, f"the request body is larger than this endpoint takes ({limit} bytes)")
    )
    head = (
        "HTTP/1.1 413 Payload Too Large\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head + body


def install() -> bool:
    """Make daphne's request class enforce the registered limits (idempotent)."""
    from daphne import http_protocol

    base = http_protocol.WebRequest
    if getattr(base, "limits_request_bodies", False):
        return True

    class BodyLimitedWebRequest(base):  # type: ignore[misc, valid-type]
        limits_request_bodies = True
        body_limit: int | None = None
        body_seen = 0
        body_refused = False

        def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
            self.body_limit = limit_for(getattr(self.channel, "_path", b"") or b"")
            super().gotLength(length)
            if self.body_limit is not None and length is not None and length > self.body_limit:
                self.refuse_body()

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
            if self.body_refused:
                return
            if self.body_limit is not None:
                self.body_seen += len(data)
                if self.body_seen > self.body_limit:
                    self.refuse_body()
                    return
            super().handleContentChunk(data)

        def process(self) -> Any:
            if self.body_refused:
                self.close_refused()
                return None
            return super().process()

        def refuse_body(self) -> None:
            self.body_refused = True
            # Drop what was stored so far; later chunks are not written anywhere.
            old: Any = getattr(self, "content", None)
            self.content = BytesIO()
            if old is not None:
                old.close()
            # Twisted answers ``Expect: 100-continue`` right after ``gotLength``.
            self.requestHeaders.removeHeader(b"expect")
            limit = self.body_limit or 0
            log.info("refused a request body over %d bytes", limit)
            transport = self.channel.transport
            if transport is None:
                return
            transport.write(refusal_bytes(limit))
            reactor = sys.modules.get("twisted.internet.reactor")
            if reactor is not None:
                reactor.callLater(LINGER_S, self.close_refused)
            else:  # pragma: no cover - a daphne request always runs under the reactor
                self.close_refused()

        def close_refused(self) -> None:
            channel = self.channel
            if channel is not None and channel.transport is not None:
                channel.transport.loseConnection()

    http_protocol.WebRequest = BodyLimitedWebRequest
    return True
