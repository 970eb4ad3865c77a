"""``session.runner`` on the session stream: whether the bound runner is online, live.

A runner's tunnel connecting or dropping (``runners.services``: connected,
disconnected, released with a dead process, restored) and a session's runner bound or
unbound call one of the functions here inside the write's transaction. After the
commit, the sessions bound to the runner are read in one statement and each session's
stream group gets one frame saying whether the runner is online now. The frame is live
only: it is not stored in the event log, so it takes no event number and a stream that
resumes does not replay it; a page that reconnects reads the session for the state now
(``runner_online``). A failed publish is logged and never fails the write.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import QuerySet

from .eventlog import Publication, send_all, session_group, sse_frame
from .models import Session
from .stream_events import session_runner_event

log = logging.getLogger(__name__)

# The message kind a session stream sends on as it is (``stream.SessionStream``).
LIVE_FRAME = "session.live"


def announce_runner_state(*, runner_id: str) -> None:
    """The runner went on- or offline: tell the streams of every session bound to it."""
    transaction.on_commit(
        lambda: _publish(Session.objects.filter(runner_id=runner_id)), robust=True
    )


def announce_session_runner(*, session_id: str) -> None:
    """The session's runner was bound or unbound: tell its streams."""
    transaction.on_commit(lambda: _publish(Session.objects.filter(pk=session_id)), robust=True)


def _publish(sessions: QuerySet[Session]) -> None:
    try:
        rows = list(sessions.select_related("runner"))
        publications: list[Publication] = [
            (
                session_group(session.id),
                {"type": LIVE_FRAME, "frame": sse_frame(session_runner_event(session))},
            )
            for session in rows
        ]
        send_all(publications)
    except Exception:
        log.exception("could not announce a runner's state to its sessions' streams")
