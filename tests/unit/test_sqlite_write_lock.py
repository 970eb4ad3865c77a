"""SQLite write transactions queue on a lock in the process (``omnigent_site/runtime/sqlite3``).

Guards: ``atomic()`` must still open its transaction through the backend's
``_start_transaction_under_autocommit`` and end it through ``_commit``/``_rollback``;
if Django stops doing so, the lock is never taken (or never released) and these fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import OperationalError, connection, connections, transaction

from omnigent_site.runtime.sqlite3.base import DatabaseWrapper, WriteLock, write_lock
from omnigent_site.runtime.write_priority import writing_ahead
from sessions.models import Agent

pytestmark = [pytest.mark.timeout(30), pytest.mark.django_db(transaction=True)]

WAIT_S = 10.0


@pytest.fixture(autouse=True)
def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the write lock is for SQLite; this run uses " + connection.vendor)


def this_lock() -> WriteLock:
    return write_lock(str(connection.settings_dict["NAME"]))


def test_the_configured_engine_is_the_queued_backend() -> None:
    assert isinstance(connections["default"], DatabaseWrapper)


def test_guard_atomic_holds_the_lock_and_commit_releases_it() -> None:
    lock = this_lock()
    assert not lock.locked()
    with transaction.atomic():
        assert lock.locked()
        with transaction.atomic():  # a savepoint: no second acquire (it would deadlock)
            Agent.objects.count()
        assert lock.locked()
    assert not lock.locked()


def test_guard_a_rollback_releases_the_lock() -> None:
    lock = this_lock()
    with pytest.raises(RuntimeError), transaction.atomic():
        assert lock.locked()
        raise RuntimeError("roll back")
    assert not lock.locked()


def test_closing_the_connection_releases_the_lock() -> None:
    lock = this_lock()
    connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
    assert lock.locked()
    connection.close()
    assert not lock.locked()


def test_a_second_writer_waits_on_the_lock_and_goes_when_the_first_commits() -> None:
    lock = this_lock()
    entered = threading.Event()
    done = threading.Event()
    order: list[str] = []

    def second() -> None:
        try:
            with transaction.atomic():
                order.append("second in")
            entered.set()
        finally:
            connections.close_all()
            done.set()

    with transaction.atomic():
        order.append("first in")
        thread = threading.Thread(target=second)
        thread.start()
        # The second writer is blocked: it cannot get in while this block holds the lock.
        assert not entered.wait(0.2)
        assert lock.locked()
        order.append("first out")
    assert done.wait(WAIT_S)
    thread.join(WAIT_S)
    assert order == ["first in", "first out", "second in"]
    assert not lock.locked()


def test_waiting_is_bounded_by_the_database_timeout() -> None:
    lock = this_lock()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = options.get("timeout")
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    assert lock.acquire(timeout=WAIT_S)
    try:
        options["timeout"] = 0.1
        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(WAIT_S)
    finally:
        lock.release()
        if saved is None:
            options.pop("timeout", None)
        else:
            options["timeout"] = saved
    assert len(errors) == 1
    assert isinstance(errors[0], OperationalError)
    assert "database is locked" in str(errors[0])


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_the_lock_is_handed_over_in_order_urgent_waiters_first() -> None:
    lock = WriteLock()
    order: list[str] = []

    def waiter(name: str, urgent: bool) -> threading.Thread:
        def run() -> None:
            assert lock.acquire(timeout=WAIT_S, urgent=urgent)
            order.append(name)
            lock.release()

        thread = threading.Thread(target=run)
        before = lock.waiting
        thread.start()
        wait_until(lambda: lock.waiting == before + 1)  # queued in this order
        return thread

    assert lock.acquire(timeout=WAIT_S)
    threads = [
        waiter("first", False),
        waiter("second", False),
        waiter("urgent", True),
        waiter("urgent too", True),
    ]
    lock.release()
    for thread in threads:
        thread.join(WAIT_S)
    assert order == ["urgent", "urgent too", "first", "second"]
    assert not lock.locked() and lock.waiting == 0


def test_a_waiter_whose_time_runs_out_leaves_the_queue() -> None:
    lock = WriteLock()
    assert lock.acquire(timeout=WAIT_S)
    assert not lock.acquire(timeout=0.05)
    assert lock.waiting == 0
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_block_writing_ahead_keeps_the_lock_from_its_first_transaction_to_its_end() -> None:
    """The tunnel's event writer stores a batch as one transaction per session; between
    them a request's transaction does not get in."""
    lock = this_lock()
    order: list[str] = []
    between = threading.Event()
    go_on = threading.Event()

    def batch() -> None:
        with writing_ahead():
            with transaction.atomic():
                order.append("session 1")
            between.set()
            assert go_on.wait(WAIT_S)
            assert lock.locked()
            with transaction.atomic():
                order.append("session 2")
        order.append("batch over")

    def request() -> None:
        with transaction.atomic():
            order.append("request")

    writer = in_thread(batch)
    assert between.wait(WAIT_S)
    other = in_thread(request)
    wait_until(lambda: lock.waiting == 1)
    go_on.set()
    writer.join(WAIT_S)
    other.join(WAIT_S)
    assert order[:2] == ["session 1", "session 2"] and "request" in order[2:]
    assert not lock.locked()


def test_a_block_writing_ahead_gets_the_lock_before_writers_that_waited_longer() -> None:
    lock = this_lock()
    order: list[str] = []

    def request() -> None:
        with transaction.atomic():
            order.append("request")

    def batch() -> None:
        with writing_ahead(), transaction.atomic():
            order.append("runner events")

    with transaction.atomic():
        first = in_thread(request)
        wait_until(lambda: lock.waiting == 1)
        second = in_thread(batch)
        wait_until(lambda: lock.waiting == 2)
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert order == ["runner events", "request"]
    assert not lock.locked()


def test_a_rollback_inside_a_block_writing_ahead_keeps_the_lock_until_the_block_ends() -> None:
    lock = this_lock()
    with writing_ahead():
        with pytest.raises(RuntimeError), transaction.atomic():
            raise RuntimeError("roll back")
        assert lock.locked()
        with transaction.atomic():  # the same lock, not taken twice (it would deadlock)
            Agent.objects.count()
    assert not lock.locked()
