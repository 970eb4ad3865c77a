"""Rendered session snapshots kept per server process, for pollers (issue 14).

Clients that poll ``GET /v1/sessions/{id}`` while a turn runs ask for the same bytes
many times between two changes. The view keys each rendered JSON body by the session
and its ETag (``selectors.snapshot_etag``), which is computed from the session row
read in the same request. A key therefore never names a body older than what the
database holds, whichever process wrote last, and nothing has to be invalidated: a
change makes a new key, and the old entries age out of the LRU order.

Bounded by entry count (``OMNIGENT_SNAPSHOT_CACHE_ENTRIES``, 0 turns the cache off) and
by bytes (``MAX_BYTES``; a body over ``MAX_ENTRY_BYTES`` is not kept). Request threads
share it, so every access holds a lock; the work inside is a few dict operations.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from django.conf import settings

MAX_BYTES = 32 * 1024 * 1024
MAX_ENTRY_BYTES = 4 * 1024 * 1024

Key = tuple[str, str]


class BodyCache:
    """A least-recently-used map of keys to bytes, bounded in entries and total bytes."""

    def __init__(self, *, max_bytes: int, max_entry_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_entry_bytes
        self._entries: OrderedDict[Key, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, *, key: Key) -> bytes | None:
        with self._lock:
            body = self._entries.get(key)
            if body is not None:
                self._entries.move_to_end(key)
            return body

    def put(self, *, key: Key, body: bytes, max_entries: int) -> None:
        if max_entries <= 0 or len(body) > self.max_entry_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._bytes -= len(previous)
            self._entries[key] = body
            self._bytes += len(body)
            while self._entries and (
                len(self._entries) > max_entries or self._bytes > self.max_bytes
            ):
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> tuple[int, int]:
        """``(entries, bytes)`` held now."""
        with self._lock:
            return len(self._entries), self._bytes


_bodies = BodyCache(max_bytes=MAX_BYTES, max_entry_bytes=MAX_ENTRY_BYTES)


def max_entries() -> int:
    """``OMNIGENT_SNAPSHOT_CACHE_ENTRIES``, read per call so tests can override it."""
    return int(settings.OMNIGENT_SNAPSHOT_CACHE_ENTRIES)


def cached_body(*, session_id: str, etag: str) -> bytes | None:
    if max_entries() <= 0:
        return None
    return _bodies.get(key=(session_id, etag))


def keep_body(*, session_id: str, etag: str, body: bytes) -> None:
    _bodies.put(key=(session_id, etag), body=body, max_entries=max_entries())


def clear() -> None:
    """Drop every kept body (tests)."""
    _bodies.clear()
