"""Coalescing of streamed text deltas: fewer, larger ``response.output_text.delta`` events.

A model streams its answer a token at a time, and the server stores every runner event
in a transaction of its own, so one event per token makes text the bulk of a turn's
events. A :class:`DeltaCoalescer`, owned by one turn, sends at most one delta event per
item per interval instead:

* the first delta of an item goes out at once, so the time to the first token does not
  grow;
* a delta arriving less than an interval after the item's last sent delta is buffered,
  and a timer sends everything buffered for that item as one delta when the interval
  has passed;
* :meth:`DeltaCoalescer.flush` sends what is buffered now. The turn calls it before any
  other event it emits (item done, status, approval request, turn end, ...) and when it
  ends however it ends, so watchers see the same order as without coalescing;
* buffered text past ``max_chars`` is sent at once, so one event never grows towards the
  tunnel's frame limit however fast a model streams.

The concatenated text is exactly the input: nothing is trimmed, reordered or repeated.
An interval of 0 turns coalescing off (every delta is sent as it comes).

Django-free and transport-free: it calls ``send(item_id, text)``; the turn decides what
that does (e.g. nothing once its session is closing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_DELTA_INTERVAL_MS = 40
MAX_DELTA_INTERVAL_MS = 1000
# Enough for any realistic interval's worth of tokens; a bound, not a tuning knob.
DEFAULT_MAX_BUFFERED_CHARS = 32 * 1024

SendDelta = Callable[[str, str], None]


class _Handle(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """The part of the event loop the coalescer uses (a fake one in tests)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> _Handle: ...


@dataclass
class _ItemBuffer:
    parts: list[str] = field(default_factory=list)
    size: int = 0
    last_sent: float | None = None  # loop time of the item's last sent delta
    timer: _Handle | None = None


class DeltaCoalescer:
    """Buffers one turn's text deltas per item; see the module docstring for the rules.

    ``scheduler`` defaults to the running event loop, looked up on first use (so the
    turn can be built outside a loop). Not thread-safe: use it from the loop's thread.
    """

    def __init__(
        self,
        *,
        send: SendDelta,
        interval_s: float,
        max_chars: int = DEFAULT_MAX_BUFFERED_CHARS,
        scheduler: Scheduler | None = None,
    ) -> None:
        if interval_s < 0:
            raise ValueError("interval_s must not be negative")
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        self._send = send
        self._interval = interval_s
        self._max_chars = max_chars
        self._scheduler = scheduler
        self._items: dict[str, _ItemBuffer] = {}

    @property
    def pending(self) -> bool:
        """Whether any text is buffered (not sent yet)."""
        return any(buffer.parts for buffer in self._items.values())

    def add(self, item_id: str, text: str) -> None:
        """Send ``text`` now if the item's interval has passed, else buffer it."""
        if not text:
            return  # an empty delta carries nothing (and was never sent)
        if self._interval <= 0:
            self._send(item_id, text)
            return
        scheduler = self._clock()
        now = scheduler.time()
        buffer = self._items.setdefault(item_id, _ItemBuffer())
        buffer.parts.append(text)
        buffer.size += len(text)
        due = buffer.last_sent is None or now - buffer.last_sent >= self._interval
        if due or buffer.size >= self._max_chars:
            self._flush_item(item_id)
        elif buffer.timer is None:
            assert buffer.last_sent is not None  # not due: something was sent before
            delay = max(0.0, buffer.last_sent + self._interval - now)
            buffer.timer = scheduler.call_later(delay, lambda: self._flush_item(item_id))

    def flush(self) -> None:
        """Send everything buffered now, item by item, and cancel the pending timers."""
        for item_id in list(self._items):
            self._flush_item(item_id)

    def _flush_item(self, item_id: str) -> None:
        buffer = self._items.get(item_id)
        if buffer is None:
            return
        if buffer.timer is not None:
            buffer.timer.cancel()  # harmless when it is the timer that is running
            buffer.timer = None
        if not buffer.parts:
            return
        text = "".join(buffer.parts)
        buffer.parts.clear()
        buffer.size = 0
        buffer.last_sent = self._clock().time()
        self._send(item_id, text)

    def _clock(self) -> Scheduler:
        if self._scheduler is None:
            self._scheduler = asyncio.get_running_loop()
        return self._scheduler
