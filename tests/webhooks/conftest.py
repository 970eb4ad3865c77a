"""Fixtures of the webhook tests: a fake DNS for the SSRF rules, a local receiver."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# The API tests' session fixtures, for events about sessions.
from tests.api.conftest import create_session, grant  # noqa: F401

# Host names the tests resolve, and what to.
FAKE_DNS = {
    "hooks.example.com": ["93.184.215.14"],
    "internal.example.com": ["10.0.0.5"],
    "mixed.example.com": ["93.184.215.14", "127.0.0.1"],
    "metadata.example.com": ["169.254.169.254"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
}


@pytest.fixture(autouse=True)
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """``webhooks.ssrf`` resolves through this table; literal addresses and localhost as
    the system does; anything else does not resolve (no test reaches the network)."""
    real = socket.getaddrinfo
    table = dict(FAKE_DNS)

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host in table:
            return [
                (
                    socket.AF_INET6 if ":" in address else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (address, port),
                )
                for address in table[host]
            ]
        if host == "localhost" or host.replace(".", "").isdigit() or ":" in host:
            return real(host, port, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr("webhooks.ssrf.socket.getaddrinfo", getaddrinfo)
    return table


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A real HTTP server on loopback: records every request, answers ``status``."""

    url: str
    requests: list[Received] = field(default_factory=list)
    status: int = 200
    answer: Callable[[Received], int] | None = None
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, *, timeout: float = 10.0) -> list[Received]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout), (
                f"{len(self.requests)} of {count} requests arrived"
            )
            return list(self.requests)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("content-length") or 0)
            got = Received(
                self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length)
            )
            me = state["receiver"]
            status = me.answer(got) if me.answer else me.status
            with me.arrived:
                me.requests.append(got)
                me.arrived.notify_all()
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["receiver"] = Receiver(url=f"http://127.0.0.1:{server.server_port}/hook")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def local_receivers_allowed(settings: Any) -> None:
    settings.OMNIGENT_WEBHOOK_ALLOW_HTTP = True
    settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE = True
