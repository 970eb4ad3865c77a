"""The shared caches on a real Redis: one connection pool per process, not per request,
and the throttles' check in one atomic script.

Django gives every request context its own cache object; with the stock pool each of
them opened its own connection to Redis (``omnigent_site/runtime/redis_cache.py``).
These tests count the connections Redis holds for the caches, so they fail if Django
stops making its pools through ``OPTIONS["pool_class"]``.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import BaseCache, caches
from django.core.exceptions import ImproperlyConfigured

from omnigent_site.runtime.redis_cache import ProcessConnectionPool, RedisCacheWithRates
from omnigent_site.settings import shared_cache
from omnigent_site.throttling import UserRateThrottle
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


def _decisions(throttle: Any, times: list[float]) -> list[float | None]:
    """What the throttle decides at each time: None for admitted, else the wait."""
    decided: list[float | None] = []
    for now in times:
        throttle.timer = lambda now=now: now
        throttle._wait_s = None
        decided.append(None if throttle._admit("alice") else round(throttle.wait(), 3))
    return decided


# 3 a minute: three at once, then one every 20 s; a refused request does not count.
TIMES = [1000.0, 1000.0, 1000.0, 1000.0, 1005.0, 1020.0, 1020.0, 1200.0, 1200.0]
EXPECTED = [None, None, None, 20.0, 15.0, None, 20.0, None, None]


def test_the_script_decides_as_the_cache_path_does(settings: Any) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "3/min"
    caches["throttle"].clear()
    in_memory = UserRateThrottle()
    assert not isinstance(in_memory.cache, RedisCacheWithRates)
    assert _decisions(in_memory, TIMES) == EXPECTED
    with on_redis(settings, "throttle"):
        on_redis_throttle = UserRateThrottle()
        assert isinstance(on_redis_throttle.cache, RedisCacheWithRates)
        assert _decisions(on_redis_throttle, TIMES) == EXPECTED


def test_requests_at_once_in_many_threads_are_each_counted(settings: Any) -> None:
    """Read, decide and write in one script: twenty requests at once, five admitted."""
    settings.OMNIGENT_THROTTLE_USER_RATE = "5/hour"
    with on_redis(settings, "throttle"):
        together = threading.Barrier(20, timeout=20)
        admitted: list[bool] = []

        def request() -> None:
            throttle = UserRateThrottle()
            together.wait()
            admitted.append(throttle._admit("alice"))

        threads = [threading.Thread(target=request) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(admitted) == 20
        assert admitted.count(True) == 5


def test_an_unreachable_redis_lets_requests_through(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "1/hour"
    config = shared_cache("throttle", "redis://127.0.0.1:1/0")
    settings.CACHES = {**settings.CACHES, "throttle": config}
    throttle = UserRateThrottle()
    request = SimpleNamespace(user=SimpleNamespace(is_authenticated=True, pk=1), method="GET")
    with caplog.at_level("WARNING", logger="omnigent_site.throttling"):
        assert throttle.allow_request(request, SimpleNamespace()) is True
        assert throttle.allow_request(request, SimpleNamespace()) is True
    assert "throttle cache unavailable; user not applied" in caplog.text


def test_the_script_takes_its_connection_from_the_caches_pool(settings: Any) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "3/min"
    name = f"omnigent-test-{secrets.token_hex(4)}"
    with on_redis(settings, "throttle", client_name=name) as (_prefix, store):
        try:
            cache = caches["throttle"]
            cache.set("plain", 1, 30)
            assert UserRateThrottle()._admit("alice")
            assert cache.get("plain") == 1
            # One connection, used by both: the script's client has the cache's pool.
            assert _connections_named(store, name) == 1
        finally:
            ProcessConnectionPool.disconnect_all()


def test_a_cache_without_the_shared_pool_class_says_so() -> None:
    config = shared_cache("throttle", URL)
    options = {k: v for k, v in config["OPTIONS"].items() if k != "pool_class"}
    cache = RedisCacheWithRates(URL, {**config, "OPTIONS": options})
    with pytest.raises(ImproperlyConfigured, match="pool_class"):
        cache.admit("k", now=0.0, interval_s=1.0, duration_s=60.0)
