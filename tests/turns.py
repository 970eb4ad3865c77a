"""Turns as the scheduler leaves them, for tests that store a message's turn directly."""

from __future__ import annotations

from django.utils import timezone

from sessions.models import Turn


def handed_to_runner(turn: Turn) -> Turn:
    """The turn as after ``runners.scheduler.claim`` gave it a slot and the runner
    acknowledged its ``turn.start``: dispatched and acknowledged.

    ``runner_events.accept_message`` stores a message's turn waiting for a slot; a
    runner that comes online would be sent it (and sent it again while no ``ack`` of it
    is recorded), which tests of a turn already running on their runner do not expect."""
    turn.dispatched_at = turn.start_acked_at = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(
        dispatched_at=turn.dispatched_at, start_acked_at=turn.start_acked_at
    )
    return turn
