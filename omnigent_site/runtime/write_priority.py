"""Writes that go ahead of others waiting for the database (``writing_ahead``).

A server process has one writer at a time on SQLite (``runtime/sqlite3``). When a
burst of requests queued on the write lock (200 messages posted at once), the tunnel
consumer storing the events of turns already running waited behind them, once per
session of its batch, and every watcher's stream stood still until the burst was
stored. Inside ``writing_ahead`` a thread takes the process's write lock before any
other waiting writer and keeps it for the block, so a batch of runner events is stored
in one go, and new work waits instead.
On PostgreSQL, whose writers do not share a lock in the process, it changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class _Block(threading.local):
    active: bool = False
    # What the block holds, and how to let each go when it ends: {lock id: release}.
    kept: dict[int, Callable[[], None]]

    def __init__(self) -> None:
        self.kept = {}


_block = _Block()


@contextmanager
def writing_ahead() -> Iterator[None]:
    """In the block, this thread's transactions take the write lock ahead of other
    waiting writers, and keep it until the block ends."""
    if _block.active:
        yield
        return
    _block.active = True
    try:
        yield
    finally:
        _block.active = False
        kept, _block.kept = _block.kept, {}
        for release in kept.values():
            release()


def writing_ahead_now() -> bool:
    return _block.active


def kept_by_block(key: int) -> bool:
    """Whether this thread's block already holds the lock ``key``."""
    return key in _block.kept


def keep_for_block(key: int, release: Callable[[], None]) -> None:
    """Hold a lock until the block ends, then ``release`` it."""
    _block.kept[key] = release
