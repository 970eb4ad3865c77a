"""Telling runners about changed budgets (usage.md, Budgets): a ``policy.update`` with
``rules=None`` (rules unchanged) and the session's new ``budgets``.

Fire and forget, like a verdict's relay after the fact: the budgets are stored first,
and a runner that misses the update gets them with its next ``turn.start``,
``session.open`` or the update after its next recorded call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync

from omnigent_runner.protocol import PolicyUpdate
from sessions import budgets
from sessions.models import Session, Turn

from .relay import post_command

log = logging.getLogger(__name__)


def budget_update_command(session: Session) -> PolicyUpdate:
    return PolicyUpdate(session_id=session.id, rules=None, budgets=budgets.budgets_for(session))


def push_session_budgets(*, sessions: Iterable[Session]) -> int:
    """Send each session's budgets to its runner if that runner is connected; returns
    how many were sent. Never raises: the change is stored already."""
    sent = 0
    for session in sessions:
        runner = session.runner
        if runner is None or not runner.channel_name:
            continue
        try:
            async_to_sync(post_command)(
                channel_name=runner.channel_name, command=budget_update_command(session)
            )
            sent += 1
        except Exception:
            log.exception("budgets of %s not sent", session.id)
    return sent


def push_user_budgets(*, user_id: int) -> int:
    """After a user's daily budget changed: their sessions with a turn open."""
    sessions = (
        Session.objects.filter(
            created_by_id=user_id,
            runner__isnull=False,
            pk__in=Turn.objects.filter(status__in=Turn.OPEN_STATUSES).values("session_id"),
        )
        .select_related("agent", "runner")
        .order_by("pk")[:500]
    )
    return push_session_budgets(sessions=sessions)
