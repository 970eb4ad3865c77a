"""Where the server's handler closes a response (``PooledThreadsASGIHandler.handle``).

A response whose close has only Django's own work to do is closed on the event loop,
without a trip to the request's thread; anything else is closed on the thread, as
Django does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.signals import request_finished
from django.db import connection, connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.test import override_settings
from django.utils.datastructures import MultiValueDict

from omnigent_site.asgi import application
from omnigent_site.runtime.handler import PooledThreadsASGIHandler

from .asgi_http import asgi_get

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Each response's close: the thread it ran on, and whether the response was closed.

    The test's own database connection (set up on this thread, which runs the event
    loop) is closed first: a server's event-loop thread holds none.
    """
    for db in connections.all(initialized_only=True):
        db.close()
    seen: list[tuple[int, bool]] = []
    real_close = HttpResponseBase.close

    def close(self: HttpResponseBase) -> None:
        real_close(self)
        seen.append((threading.get_ident(), self.closed))

    monkeypatch.setattr(HttpResponseBase, "close", close)
    return seen


async def test_a_plain_response_is_closed_on_the_event_loop(
    closes: list[tuple[int, bool]],
) -> None:
    """``/health`` reads the database on its request's thread; its close needs none."""
    for _ in range(3):
        status, body = await asgi_get(application, "/health")
        assert status == 200, body
    assert closes == [(threading.get_ident(), True)] * 3


class FinishedOn:
    """A ``request_finished`` receiver of the kind an app may add: it could touch the
    thread's database connection, so its close must run on the request's thread."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.threads.append(threading.get_ident())


@pytest.fixture
def other_receiver() -> Iterator[FinishedOn]:
    receiver = FinishedOn()
    request_finished.connect(receiver, sender=PooledThreadsASGIHandler)
    yield receiver
    request_finished.disconnect(receiver, sender=PooledThreadsASGIHandler)


async def test_a_close_with_another_receiver_runs_on_the_request_thread(
    closes: list[tuple[int, bool]], other_receiver: FinishedOn
) -> None:
    status, body = await asgi_get(application, "/health")
    assert status == 200, body
    [(thread, closed)] = closes
    assert closed and thread != threading.get_ident()
    assert other_receiver.threads == [thread]


async def test_with_debug_a_close_runs_on_the_request_thread(
    closes: list[tuple[int, bool]],
) -> None:
    """With ``DEBUG`` the close clears the query log of the request's thread."""
    with override_settings(DEBUG=True):
        status, body = await asgi_get(application, "/health")
    assert status == 200, body
    [(thread, closed)] = closes
    assert closed and thread != threading.get_ident()


def make_handler() -> PooledThreadsASGIHandler:
    return PooledThreadsASGIHandler(max_idle_threads=1)


def test_streamed_responses_and_responses_with_other_closers_close_on_the_thread() -> None:
    handler = make_handler()
    assert handler.closes_on_loop(HttpResponse(b"{}"))
    assert not handler.closes_on_loop(StreamingHttpResponse(iter([b"x"])))
    with_closer = HttpResponse(b"{}")
    with_closer._resource_closers.append(lambda: None)
    assert not handler.closes_on_loop(with_closer)
    request = HttpRequest()
    with_request = HttpResponse(b"{}")
    with_request._resource_closers.append(request.close)
    assert handler.closes_on_loop(with_request)  # Django adds this one to every response
    request._files = MultiValueDict({"file": [SimpleUploadedFile("a.txt", b"x")]})
    assert not handler.closes_on_loop(with_request)  # closing it deletes the uploads


def test_a_cache_whose_close_does_work_sends_the_close_to_the_thread() -> None:
    memcached = {"BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache"}
    with override_settings(CACHES={"default": memcached}):
        assert not make_handler().closes_on_loop(HttpResponse(b"{}"))
    assert make_handler().closes_on_loop(HttpResponse(b"{}"))


def test_a_loop_thread_holding_a_database_connection_sends_the_close_to_the_thread() -> None:
    """``close_old_connections`` on such a thread could have to close it, and a close is
    not allowed (and would block) on the event loop."""
    handler = make_handler()
    connection.ensure_connection()
    try:
        assert not handler.closes_on_loop(HttpResponse(b"{}"))
    finally:
        connection.close()
    assert handler.closes_on_loop(HttpResponse(b"{}"))
