"""Requests through ``omnigent_site.asgi.application`` reuse threads and connections.

Stock Django starts a thread for every ASGI request and opens a database
connection in it; the pooled handler keeps both for later requests.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db import connection

from omnigent_site.asgi import application
from omnigent_site.runtime.handler import PooledThreadsASGIHandler

from .asgi_http import asgi_get

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


async def get(path: str) -> tuple[int, bytes]:
    return await asgi_get(application, path)


class RequestEnds:
    """Where each request ended: its thread, and the database connection it held there.

    ``request_finished`` runs in the request's own thread, like its ORM calls.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[int, int | None]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        raw = connection.connection
        self.seen.append((threading.get_ident(), None if raw is None else id(raw)))

    def __enter__(self) -> RequestEnds:
        request_finished.connect(self, sender=PooledThreadsASGIHandler)
        return self

    def __exit__(self, *exc: object) -> None:
        request_finished.disconnect(self, sender=PooledThreadsASGIHandler)


async def test_sequential_requests_share_one_thread_and_one_connection() -> None:
    with RequestEnds() as ends:
        for _ in range(5):
            status, body = await get("/health")
            assert status == 200, body
    assert len(ends.seen) == 5
    threads = {thread for thread, _ in ends.seen}
    assert len(threads) == 1
    assert threading.get_ident() not in threads
    if connection.vendor == "sqlite" and connection.settings_dict["CONN_MAX_AGE"]:
        # /health queried the database each time, on the connection kept from before.
        raw_connections = {raw for _, raw in ends.seen}
        assert len(raw_connections) == 1 and None not in raw_connections


async def test_overlapping_requests_run_on_threads_of_their_own() -> None:
    with RequestEnds() as ends:
        results = await asyncio.gather(*(get("/health") for _ in range(3)))
    assert [status for status, _ in results] == [200, 200, 200]
    assert len({thread for thread, _ in ends.seen}) == 3
