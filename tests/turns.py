"""Turns as the scheduler leaves them, for tests that store a message's turn directly."""

from __future__ import annotations

from django.utils import timezone

from sessions.models import Turn


def handed_to_runner(turn: Turn) -> Turn:
    """The turn as after ``runners.scheduler.claim`` gave it a slot: dispatched.

    ``runner_events.accept_message`` stores a message's turn waiting for a slot; a
    runner that comes online would be sent it, which tests of a turn already running
    on their runner do not expect."""
    turn.dispatched_at = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(dispatched_at=turn.dispatched_at)
    return turn
