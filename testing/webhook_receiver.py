"""A webhook receiver on loopback for tests and benchmarks: a real HTTP server.

It records every request (path, headers, body, arrival time) and answers ``status``
(or what ``answer`` returns). ``down()`` closes its port, so senders get a refused
connection, and ``up()`` opens the same port again. Django-free.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Listener(ThreadingHTTPServer):
    # ``socketserver``'s accept queue is 5: a sender opening its 32 connections at once
    # lost SYNs and sent them again a second later, which the benchmarks measured as
    # delivery latency. Receivers in production listen with far longer queues.
    request_queue_size = 128


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    # ``time.time()`` when the body had arrived.
    at: float


class WebhookReceiver:
    def __init__(
        self, *, host: str = "127.0.0.1", path: str = "/hook", tls: ssl.SSLContext | None = None
    ) -> None:
        self.host = host
        # A server-side TLS context: the receiver speaks HTTPS.
        self.tls = tls
        self.port = 0
        self.path = path
        self.status = 200
        self.answer: Callable[[Received], int] | None = None
        self.requests: list[Received] = []
        self._arrived = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        # Open connections, closed by ``down()`` too (a sender may keep one alive).
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}{self.path}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                receiver._connections.add(self.connection)

            def finish(self) -> None:
                receiver._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                got = Received(
                    self.path,
                    {key.lower(): value for key, value in self.headers.items()},
                    self.rfile.read(length),
                    time.time(),
                )
                status = receiver.answer(got) if receiver.answer else receiver.status
                with receiver._arrived:
                    receiver.requests.append(got)
                    receiver._arrived.notify_all()
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def up(self) -> WebhookReceiver:
        """Listen (on the same port as before, if it listened before)."""
        server = _Listener((self.host, self.port), self._handler())
        server.daemon_threads = True
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        self.port = server.server_port
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Stop listening: connections are refused until ``up()``."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_for(self, count: int, *, timeout: float = 10.0) -> list[Received]:
        """The requests once ``count`` have arrived; AssertionError after ``timeout``."""
        with self._arrived:
            arrived = self._arrived.wait_for(lambda: len(self.requests) >= count, timeout)
            assert arrived, f"{len(self.requests)} of {count} requests arrived"
            return list(self.requests)

    def __enter__(self) -> WebhookReceiver:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
