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

The hooks are Django's: the SQLite backend's ``_start_transaction_under_autocommit``
(how ``atomic()`` opens a transaction on SQLite) and ``_commit``/``_rollback``/``close``;
``tests/unit/test_runtime_guards.py`` fails if ``atomic()`` stops going through them.
Subclassing a built-in backend and naming it in ``ENGINE`` is how Django's
documentation says to change one.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

DEFAULT_WAIT_S = 5.0

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def write_lock(name: str) -> threading.Lock:
    """The lock of the database file ``name`` in this process."""
    with _locks_guard:
        lock = _locks.get(name)
        if lock is None:
            lock = _locks[name] = threading.Lock()
        return lock


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_lock: threading.Lock | None = None

    def _write_lock_for_connection(self) -> threading.Lock | None:
        name = str(self.settings_dict["NAME"])
        if self.is_in_memory_db():
            return None  # a connection of its own: nothing to share
        return write_lock(name)

    def _start_transaction_under_autocommit(self) -> None:
        lock = self._write_lock_for_connection()
        if lock is not None and self._write_lock is None:
            wait_s = float(self.settings_dict.get("OPTIONS", {}).get("timeout", DEFAULT_WAIT_S))
            if not lock.acquire(timeout=wait_s):
                raise OperationalError("database is locked")
            self._write_lock = lock
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._release_write_lock()
            raise

    def _release_write_lock(self) -> None:
        lock, self._write_lock = self._write_lock, None
        if lock is not None:
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
