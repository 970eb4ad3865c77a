"""Django's SQLite backend, with write transactions queued on a lock in the process.

SQLite lets one connection write at a time. With ``transaction_mode=IMMEDIATE`` every
``atomic()`` block takes the database's write lock at ``BEGIN``, and a connection that
finds it taken waits in SQLite's busy handler, which sleeps and retries in steps of
1, 2, 5, 10 … up to 100 ms, however soon the lock is released. A server process
writes from many threads at once (request threads storing messages, the tunnel
consumer storing runner events), so under load those sleeps, not the transactions,
were most of a turn (``docs/performance.md``, overrides).

Here a transaction first takes a lock shared by every connection of this process to
the same database file, and only then sends ``BEGIN``: a waiting thread wakes the
moment the previous transaction commits or rolls back, and SQLite's busy handler is
left to the rare writer in another process (``manage.py`` commands, a second
server). The lock is released however the transaction ends: commit, rollback, or the
connection closing. Waiting is bounded by the database's ``timeout`` option, after
which the same ``OperationalError`` as SQLite's ("database is locked") is raised.

The lock is handed over in order (``WriteLock``), and a thread inside
``write_priority.writing_ahead`` (the tunnel's event writer) takes it ahead of every
other waiting writer and keeps it until its block ends: a batch of runner events,
one transaction per session, then waits once, not behind a request's transaction
before each of its sessions.

The hooks are Django's: the SQLite backend's ``_start_transaction_under_autocommit``
(how ``atomic()`` opens a transaction on SQLite) and ``_commit``/``_rollback``/``close``;
``tests/unit/test_runtime_guards.py`` fails if ``atomic()`` stops going through them.
Subclassing a built-in backend and naming it in ``ENGINE`` is how Django's
documentation says to change one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

from .. import write_priority

DEFAULT_WAIT_S = 5.0


class WriteLock:
    """A lock handed over in order: to the longest-waiting ``urgent`` writer, else to the
    longest-waiting other one.

    ``threading.Lock`` wakes a waiter on release but lets any thread take it first: under
    a burst of requests the running ones took it again and again while a waiter slept
    through a second or more. Here ``release`` passes the lock to the next waiter.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._urgent: deque[threading.Lock] = deque()
        self._others: deque[threading.Lock] = deque()

    def locked(self) -> bool:
        return self._held

    @property
    def waiting(self) -> int:
        return len(self._urgent) + len(self._others)

    def acquire(self, *, timeout: float, urgent: bool = False) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            waiter = threading.Lock()
            waiter.acquire()
            queue = self._urgent if urgent else self._others
            queue.append(waiter)
        if waiter.acquire(timeout=timeout):
            return True  # handed over by ``release``
        with self._mutex:
            try:
                queue.remove(waiter)
            except ValueError:
                return True  # handed over just as the wait ran out
            return False

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an unheld write lock")
            queue = self._urgent or self._others
            if queue:
                queue.popleft().release()  # still held: now by that waiter
            else:
                self._held = False


_locks: dict[str, WriteLock] = {}
_locks_guard = threading.Lock()


def write_lock(name: str) -> WriteLock:
    """The lock of the database file ``name`` in this process."""
    with _locks_guard:
        lock = _locks.get(name)
        if lock is None:
            lock = _locks[name] = WriteLock()
        return lock


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_lock: WriteLock | None = None
        self._write_lock_kept = False  # held by a ``writing_ahead`` block, not by us

    def _write_lock_for_connection(self) -> WriteLock | None:
        name = str(self.settings_dict["NAME"])
        if self.is_in_memory_db():
            return None  # a connection of its own: nothing to share
        return write_lock(name)

    def _start_transaction_under_autocommit(self) -> None:
        lock = self._write_lock_for_connection()
        if lock is not None and self._write_lock is None:
            ahead = write_priority.writing_ahead_now()
            if not (ahead and write_priority.kept_by_block(id(lock))):
                wait_s = float(self.settings_dict.get("OPTIONS", {}).get("timeout", DEFAULT_WAIT_S))
                if not lock.acquire(timeout=wait_s, urgent=ahead):
                    raise OperationalError("database is locked")
                if ahead:
                    write_priority.keep_for_block(id(lock), lock.release)
            self._write_lock, self._write_lock_kept = lock, ahead
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self) -> None:
        lock, self._write_lock = self._write_lock, None
        kept, self._write_lock_kept = self._write_lock_kept, False
        if lock is not None and not kept:
            lock.release()

    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]  # not in the stubs
        finally:
            self._release_write_lock()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]  # not in the stubs
        finally:
            self._release_write_lock()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release_write_lock()
