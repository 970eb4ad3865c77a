"""The pooled request threads of ``omnigent_site.handler`` (no database, no server)."""

from __future__ import annotations

import threading

from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, reset_queries

from omnigent_site.handler import (
    PooledThreadsASGIHandler,
    RequestThreadPool,
    move_request_housekeeping_to_end,
)


def thread_of(executor: object) -> int:
    return executor.submit(threading.get_ident).result(timeout=10)  # type: ignore[attr-defined]


def test_a_released_thread_serves_the_next_request() -> None:
    pool = RequestThreadPool(max_idle=2)
    first = pool.acquire()
    ident = thread_of(first)
    pool.release(first)
    again = pool.acquire()
    assert again is first
    assert thread_of(again) == ident
    pool.release(again)
    assert pool.idle == 1


def test_concurrent_requests_get_threads_of_their_own() -> None:
    pool = RequestThreadPool(max_idle=4)
    one, two = pool.acquire(), pool.acquire()
    assert one is not two
    assert thread_of(one) != thread_of(two)
    pool.release(one)
    pool.release(two)
    # Most recently released first.
    assert pool.acquire() is two


def test_threads_beyond_the_idle_limit_are_stopped() -> None:
    pool = RequestThreadPool(max_idle=1)
    kept, extra = pool.acquire(), pool.acquire()
    extra_thread = extra.submit(threading.current_thread).result(timeout=10)
    pool.release(kept)
    pool.release(extra)
    assert pool.idle == 1
    extra_thread.join(timeout=10)
    assert not extra_thread.is_alive()
    assert pool.acquire() is kept


def test_work_left_by_a_cancelled_request_runs_before_the_next_request_on_that_thread() -> None:
    pool = RequestThreadPool(max_idle=1)
    executor = pool.acquire()
    gate = threading.Event()
    order: list[str] = []
    executor.submit(lambda: (gate.wait(10), order.append("left over")))
    pool.release(executor)
    reused = pool.acquire()
    future = reused.submit(order.append, "next request")
    gate.set()
    future.result(timeout=10)
    assert order == ["left over", "next request"]


def receivers(signal: signals.Signal, sender: type) -> list[object]:
    # ``send_robust`` returns (receiver, response or error) for every receiver that got
    # the signal; an error (no database in a unit test) does not matter here.
    return [receiver for receiver, _ in signal.send_robust(sender=sender)]


def test_start_of_request_housekeeping_runs_at_the_end_of_pooled_requests() -> None:
    move_request_housekeeping_to_end()  # idempotent; the test client may have undone part
    started = receivers(signals.request_started, PooledThreadsASGIHandler)
    assert close_old_connections not in started
    assert reset_queries not in started
    finished = receivers(signals.request_finished, PooledThreadsASGIHandler)
    assert close_old_connections in finished
    assert reset_queries in finished


def test_django_own_handlers_keep_their_start_of_request_housekeeping() -> None:
    move_request_housekeeping_to_end()
    for handler in (WSGIHandler, ASGIHandler):
        started = receivers(signals.request_started, handler)
        assert close_old_connections in started
        assert reset_queries in started
