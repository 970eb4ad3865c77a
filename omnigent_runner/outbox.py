"""Per-session event numbering and the buffer of events the server has not acknowledged.

Delivery is at-least-once (tunnel.md, Events): every event keeps its ``seq`` until the
server's cumulative ``event.ack`` says it is stored, and everything still here is resent
after a reconnect. The buffer is bounded: a runner cut off from its server must not grow
memory without limit, so past the cap a session's events are dropped and the session is
reported ``failed`` once instead.

Not thread-safe: it is only touched from the tunnel's event loop.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from omnigent_runner.protocol import (
    AnyEvent,
    ErrorInfo,
    EventFrame,
    SessionStatus,
    encode_bytes,
    event_response_id,
    frame_type,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_UNACKED = 10_000
BACKLOG_FULL_CODE = "event_backlog_full"
TOO_LARGE_CODE = "event_too_large"
# The server refuses WebSocket messages above its frame limit (16 MiB by default);
# keep room for the frame's envelope.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024 - 64 * 1024


@dataclass
class _SessionLog:
    next_seq: int = 1
    unacked: deque[EventFrame] = field(default_factory=deque)
    last_response_id: str | None = None
    # Set once the backlog-full failure has been reported in the current overflow; it
    # clears when there is room again.
    overflowed: bool = False
    # The response that failure named: its later events are dropped even once there is
    # room again, since the server already recorded that turn as failed.
    failed_response_id: str | None = None


class Outbox:
    """Numbers events per session and holds them until acknowledged."""

    def __init__(
        self,
        max_unacked: int = DEFAULT_MAX_UNACKED,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        self._max_unacked = max_unacked
        self._max_event_bytes = max_event_bytes
        self._sessions: dict[str, _SessionLog] = {}
        self._total = 0

    def __len__(self) -> int:
        """Unacknowledged events across all sessions."""
        return self._total

    def _log(self, session_id: str) -> _SessionLog:
        log = self._sessions.get(session_id)
        if log is None:
            log = self._sessions[session_id] = _SessionLog()
        return log

    def _store(self, session_id: str, log: _SessionLog, event: AnyEvent) -> EventFrame:
        frame = EventFrame(session_id=session_id, seq=log.next_seq, event=event)
        log.next_seq += 1
        log.unacked.append(frame)
        self._total += 1
        return frame

    def emit(self, session_id: str, event: AnyEvent) -> EventFrame | None:
        """Number and keep ``event``; return its frame, or ``None`` if it was dropped.

        When the backlog is full the first event refused for a session is replaced by a
        ``session.status failed`` (``event_backlog_full``), which is kept past the cap so
        the server learns why the session went quiet; further events are dropped.
        """
        event = self._fit(event)
        log = self._log(session_id)
        response_id = event_response_id(event)
        if response_id is not None:
            log.last_response_id = response_id
            if response_id == log.failed_response_id:
                return None  # the server was already told this turn failed
        if self._total < self._max_unacked:
            log.overflowed = False
            return self._store(session_id, log, event)
        if log.overflowed:
            return None

        log.overflowed = True
        log.failed_response_id = log.last_response_id
        logger.warning(
            "event backlog full (%d unacknowledged events): dropping events of session %s "
            "and reporting it failed",
            self._total,
            session_id,
        )
        failure = SessionStatus(
            status="failed",
            response_id=log.last_response_id,
            error=ErrorInfo(
                code=BACKLOG_FULL_CODE,
                message=(
                    f"the runner holds {self._total} events the server has not acknowledged; "
                    "later events of this session were dropped"
                ),
            ),
        )
        return self._store(session_id, log, failure)

    def _fit(self, event: AnyEvent) -> AnyEvent:
        """An event the server would refuse (too large) becomes a failure it can store.

        Sending it would close the tunnel on every resend and wedge the session.
        """
        size = len(encode_bytes(event))
        if size <= self._max_event_bytes:
            return event
        kind = frame_type(event)
        logger.error(
            "event %s of %d bytes exceeds the %d-byte frame limit: reporting the turn failed",
            kind,
            size,
            self._max_event_bytes,
        )
        return SessionStatus(
            status="failed",
            response_id=event_response_id(event),
            error=ErrorInfo(
                code=TOO_LARGE_CODE,
                message=f"a {kind} event of {size} bytes exceeds the tunnel's frame limit",
            ),
        )

    def ack(self, session_id: str, seq: int) -> None:
        """Forget every event of ``session_id`` with ``seq`` at or below ``seq`` (cumulative)."""
        log = self._sessions.get(session_id)
        if log is None:
            return
        while log.unacked and log.unacked[0].seq <= seq:
            log.unacked.popleft()
            self._total -= 1

    def resync(self, session_id: str, last_acked_seq: int) -> None:
        """Apply the server's view from ``welcome``: it stored everything up to ``last_acked_seq``.

        Numbering continues after it, so a restarted runner (which starts counting at 1
        again) never reuses a seq the server would discard as a duplicate.
        """
        self.ack(session_id, last_acked_seq)
        log = self._log(session_id)
        log.next_seq = max(log.next_seq, last_acked_seq + 1)

    def pending(self) -> list[EventFrame]:
        """Every unacknowledged frame, in seq order within each session, for a resend."""
        return [frame for log in self._sessions.values() for frame in log.unacked]
