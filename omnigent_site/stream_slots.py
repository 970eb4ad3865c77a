"""Open streams per user (http-api.md, "Limits on clients"): at most
``OMNIGENT_MAX_STREAMS_PER_USER`` Server-Sent Event streams at a time, 429 beyond.

A stream holds a socket, a channel-layer subscription and a few tasks for as long as its
client keeps it open, so one client opening thousands would hurt every other. A slot is
taken before the response starts and given back when the stream ends, whichever way:
its body finishing (``[DONE]``), the client going away (Django closes the body's
iterator and then the response), or the server stopping.

The count is kept per server process. With N processes behind a balancer one user may
hold up to N times the limit in all; each process stays bounded, which is what the
limit protects (deployment.md).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.exceptions import Throttled

from . import metrics

# What a refused client is told to wait: streams end when their watchers leave, at no
# known time, so this is a polite pause rather than a promise.
RETRY_AFTER_S = 5


class StreamSlots:
    """Open streams per user key in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    def try_acquire(self, key: str, *, limit: int) -> StreamSlot | None:
        """A counted slot, None when ``key`` holds ``limit`` already; with no limit
        (0), a slot that counts nothing."""
        if limit <= 0:
            return StreamSlot(self, key, held=False)
        with self._lock:
            if self._open[key] >= limit:
                return None
            self._open[key] += 1
        return StreamSlot(self, key)

    def open_streams(self, key: str) -> int:
        with self._lock:
            return self._open[key]

    def _release(self, key: str) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]


class StreamSlot:
    """One open stream; ``release`` gives the slot back (once, however often called)."""

    def __init__(self, slots: StreamSlots, key: str, *, held: bool = True) -> None:
        self._slots = slots
        self._key = key
        self._lock = threading.Lock()
        self._held = held
        self._open = True  # counted in ``omnigent_open_streams`` until released
        metrics.stream_opened()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
            was_open, self._open = self._open, False
        if was_open:
            metrics.stream_closed()
        if held:
            self._slots._release(self._key)

    async def guard(self, body: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """``body``, giving the slot back as soon as it ends or is closed."""
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.release()


stream_slots = StreamSlots()


class SlotStreamingResponse(StreamingHttpResponse):
    """A stream that holds ``slot`` until its body ends or the response is closed
    (Django closes every response it has started, a client gone away included)."""

    def __init__(self, body: AsyncIterable[bytes], *, slot: StreamSlot, **kwargs: Any) -> None:
        super().__init__(slot.guard(body), **kwargs)
        self._slot = slot

    def close(self) -> None:
        self._slot.release()
        super().close()


def claim_stream_slot(user: Any) -> StreamSlot:
    """A slot for one more stream of ``user``, or DRF's ``Throttled`` (429 ``rate_limited``
    with ``Retry-After``). No limit in local single-user mode or with a limit of 0."""
    limit = 0 if settings.OMNIGENT_LOCAL_SINGLE_USER else settings.OMNIGENT_MAX_STREAMS_PER_USER
    slot = stream_slots.try_acquire(str(user.pk), limit=limit)
    if slot is None:
        raise Throttled(
            wait=RETRY_AFTER_S,
            detail=f"too many open streams: at most {limit} per user; close one first",
        )
    return slot
