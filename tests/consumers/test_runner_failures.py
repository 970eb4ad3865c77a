"""Failures around the tunnel: a vanished server process, a missing bundle file."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runners import services
from runners.models import Runner
from runners.runner_events import accept_message
from sessions import blobs
from sessions.models import Session, Turn

from .stubs import MESSAGE, Stubs, bind, error_of, in_db, post_event

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


def _busy_session_on(runner: Runner, session: Session) -> str:
    Session.objects.filter(pk=session.pk).update(runner=runner)
    _item, response = accept_message(
        session_id=session.id, created_by="alice@example.com", data=MESSAGE, tools=[]
    )
    return response.id


def test_sessions_of_a_runner_whose_server_process_died_are_failed(
    runner_token: tuple[Runner, str], session: Session, settings: Any
) -> None:
    runner, _token = runner_token
    response_id = _busy_session_on(runner, session)
    long_ago = timezone.now() - timedelta(
        seconds=3 * settings.OMNIGENT_HEARTBEAT_S + 60 + settings.OMNIGENT_RECONNECT_GRACE_S
    )
    # The row still names a tunnel, but nobody has refreshed it: its process is gone.
    Runner.objects.filter(pk=runner.pk).update(
        channel_name="specific.dead!x", generation=3, last_seen_at=long_ago
    )

    assert services.fail_stale_runners() == [session.id]
    session.refresh_from_db()
    assert session.status == "failed"
    assert session.last_task_error["code"] == "runner_disconnected"
    assert Turn.objects.get(id=response_id).status == "failed"
    assert Runner.objects.get(pk=runner.pk).channel_name == ""
    assert services.fail_stale_runners() == []


def test_a_live_runner_and_a_runner_inside_its_grace_are_left_alone(
    runner_token: tuple[Runner, str], session: Session
) -> None:
    runner, _token = runner_token
    _busy_session_on(runner, session)
    Runner.objects.filter(pk=runner.pk).update(
        channel_name="specific.live!x", generation=1, last_seen_at=timezone.now()
    )
    assert services.fail_stale_runners() == []
    Runner.objects.filter(pk=runner.pk).update(channel_name="", disconnected_at=timezone.now())
    assert services.fail_stale_runners() == []
    session.refresh_from_db()
    assert session.status == "running"


async def test_a_missing_bundle_fails_the_turn_clearly_and_the_runner_still_connects(
    stubs: Stubs, runner_token: tuple[Runner, str], session: Session
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    agent = await in_db(lambda: session.agent)()
    blobs.bundle_path(agent.bundle_sha256).unlink()

    stub = await stubs.online(token)  # welcome arrives although the bundle is gone
    response = await post_event(session.id, {"type": "message", "data": MESSAGE})
    message = error_of(response, 500, "internal_error")
    assert "OMNIGENT_DATA_DIR" in message
    turn = await in_db(lambda: Turn.objects.get(session=session))()
    assert turn.status == "failed" and turn.error["code"] == "agent_load_failed"
    await stub.nothing_pending()

    # A restart with that turn still open: the runner comes online, the turn is failed.
    await in_db(Turn.objects.filter(pk=turn.pk).update)(status="queued")
    await stub.drop()
    again = await stubs.online(token)
    await again.nothing_pending()
    turn = await in_db(lambda: Turn.objects.get(session=session))()
    assert turn.status == "failed"
