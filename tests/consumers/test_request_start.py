"""``request_started`` on the server's handler (``PooledThreadsASGIHandler.handle``).

Django's ``ASGIHandler`` sends it with ``asend`` for every request, which gathers an
empty coroutine in a task of its own even when nobody listens. The server's handler
sends it only when a receiver listens to it, and then exactly as Django does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core import signals

from omnigent_site.asgi import application
from omnigent_site.runtime.handler import PooledThreadsASGIHandler, move_request_housekeeping_to_end

from .asgi_http import asgi_get

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


class Started:
    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    def __call__(self, sender: Any, scope: dict[str, Any], **kwargs: Any) -> None:
        assert sender is PooledThreadsASGIHandler
        self.scopes.append(scope)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``request_started.asend`` the handler makes (then made as usual).

    Django's test client connects ``close_old_connections`` for every sender again
    around its requests; the server's own arrangement is restored first.
    """
    move_request_housekeeping_to_end()
    calls: list[Any] = []
    real_asend = signals.request_started.asend

    async def asend(sender: Any, **named: Any) -> Any:
        calls.append(sender)
        return await real_asend(sender, **named)

    monkeypatch.setattr(signals.request_started, "asend", asend)
    return calls


@pytest.fixture
def receiver() -> Iterator[Started]:
    started = Started()
    signals.request_started.connect(started, sender=PooledThreadsASGIHandler)
    yield started
    signals.request_started.disconnect(started, sender=PooledThreadsASGIHandler)


async def test_nobody_listening_sends_nothing(sent: list[Any]) -> None:
    assert not signals.request_started.has_listeners(PooledThreadsASGIHandler)
    status, body = await asgi_get(application, "/health")
    assert status == 200, body
    assert sent == []


async def test_a_receiver_of_the_handler_hears_every_request(
    sent: list[Any], receiver: Started
) -> None:
    for _ in range(2):
        status, body = await asgi_get(application, "/health")
        assert status == 200, body
    assert sent == [PooledThreadsASGIHandler] * 2
    assert [scope["path"] for scope in receiver.scopes] == ["/health"] * 2


async def test_a_receiver_of_every_sender_hears_it_too(sent: list[Any]) -> None:
    heard: list[Any] = []

    def any_sender(sender: Any, **kwargs: Any) -> None:
        heard.append(sender)

    signals.request_started.connect(any_sender)
    try:
        status, body = await asgi_get(application, "/health")
    finally:
        signals.request_started.disconnect(any_sender)
    assert status == 200, body
    assert heard == [PooledThreadsASGIHandler]
