"""SQLite write transactions queue on a lock in the process (``omnigent_site/runtime/sqlite3``).

Guards: ``atomic()`` must still open its transaction through the backend's
``_start_transaction_under_autocommit`` and end it through ``_commit``/``_rollback``;
if Django stops doing so, the lock is never taken (or never released) and these fail.
"""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, connections, transaction

from omnigent_site.runtime.sqlite3.base import DatabaseWrapper, write_lock
from sessions.models import Agent

pytestmark = [pytest.mark.timeout(30), pytest.mark.django_db(transaction=True)]

WAIT_S = 10.0


@pytest.fixture(autouse=True)
def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the write lock is for SQLite; this run uses " + connection.vendor)


def this_lock() -> threading.Lock:
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
