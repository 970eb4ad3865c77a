"""The shared caches on a real Redis: one connection pool per process, not per request.

Django gives every request context its own cache object; with the stock pool each of
them opened its own connection to Redis (``omnigent_site/runtime/redis_cache.py``).
These tests count the connections Redis holds for the caches, so they fail if Django
stops making its pools through ``OPTIONS["pool_class"]``.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import BaseCache, caches

from omnigent_site.runtime.redis_cache import ProcessConnectionPool
from tests.conftest import on_redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

URL = "redis://127.0.0.1:6379/13"


def _connections_named(store: Any, name: str) -> int:
    return sum(1 for client in store.client_list() if client.get("name") == name)


async def test_requests_in_contexts_of_their_own_share_one_connection(settings: Any) -> None:
    name = f"omnigent-test-{secrets.token_hex(4)}"
    with on_redis(settings, "throttle", client_name=name) as (_prefix, store):
        kept: list[BaseCache] = []  # every cache object stays alive, and so its pool

        def request(number: int) -> None:
            cache = caches["throttle"]
            kept.append(cache)
            cache.set(f"user-{number}", number, 30)
            assert cache.get(f"user-{number}") == number

        try:
            for number in range(20):
                # As a request does: a task (a context of its own), then its thread.
                await asyncio.create_task(sync_to_async(request)(number))
            # Django made a cache object per context: the case this module is about.
            assert len({id(cache) for cache in kept}) == 20
            assert _connections_named(store, name) == 1
        finally:
            ProcessConnectionPool.disconnect_all()
        assert _connections_named(store, name) == 0


def test_threads_at_once_take_at_most_one_connection_each_and_give_them_back(
    settings: Any,
) -> None:
    name = f"omnigent-test-{secrets.token_hex(4)}"
    with on_redis(settings, "presence", client_name=name) as (_prefix, store):
        together = threading.Barrier(4, timeout=20)
        errors: list[BaseException] = []

        def worker(number: int) -> None:
            try:
                cache = caches["presence"]
                together.wait()
                for step in range(10):
                    cache.set(f"mark-{number}", step, 30)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        try:
            for _ in range(3):
                threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(timeout=30)
            assert errors == []
            # Four at once at most; the later rounds use the same four again.
            assert 1 <= _connections_named(store, name) <= 4
        finally:
            ProcessConnectionPool.disconnect_all()


def test_one_pool_per_url_and_options() -> None:
    first = ProcessConnectionPool.from_url(URL, socket_timeout=2.0, client_name="a")
    assert ProcessConnectionPool.from_url(URL, client_name="a", socket_timeout=2.0) is first
    assert ProcessConnectionPool.from_url(URL, socket_timeout=3.0, client_name="a") is not first
    other_database = "redis://127.0.0.1:6379/12"
    assert (
        ProcessConnectionPool.from_url(other_database, socket_timeout=2.0, client_name="a")
        is not first
    )
