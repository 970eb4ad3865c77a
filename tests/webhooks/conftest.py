"""Fixtures of the webhook tests: a fake DNS for the SSRF rules, a local receiver."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from testing.webhook_receiver import WebhookReceiver

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


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A real HTTP receiver on loopback (``testing/webhook_receiver.py``)."""
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
def local_receivers_allowed(settings: Any) -> None:
    settings.OMNIGENT_WEBHOOK_ALLOW_HTTP = True
    settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE = True
