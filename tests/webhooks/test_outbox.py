"""The outbox (automation.md, Delivered at least once): each fact's event is written in
the fact's own transaction, by the fact's writer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from runners import runner_events, services
from sessions.models import Session, Turn
from tests.api.conftest import ALICE, BOB, ask
from tests.api.conftest import webhook_subscriber as webhook_subscriber
from webhook_outbox.events import enqueue_webhook_event
from webhook_outbox.models import WebhookEvent
from webhooks.models import Webhook

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("webhook_subscriber")]


def events(kind: str) -> list[WebhookEvent]:
    return list(WebhookEvent.objects.filter(type=kind))


def test_session_created_and_deleted(
    create_session: Callable[..., str],
    grant: Callable[..., None],
    client_for: Callable[..., APIClient],
) -> None:
    session_id = create_session(ALICE)
    [created] = events("session.created")
    assert created.id.startswith("evt_") and created.session_id == session_id
    assert created.data["session_id"] == session_id
    grant(session_id, BOB, 1)
    assert client_for(ALICE).delete(f"/v1/sessions/{session_id}").status_code == 200
    [deleted] = events("session.deleted")
    users = get_user_model().objects
    readers = {users.get(username=ALICE).pk, users.get(username=BOB).pk}
    assert set(deleted.audience) == readers and deleted.data == {"session_id": session_id}


def test_the_event_rolls_back_with_its_fact(create_session: Callable[..., str]) -> None:
    session_id = create_session(ALICE)
    before = WebhookEvent.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_webhook_event(type="session.created", data={}, session_id=session_id)
        raise RuntimeError("the fact's transaction fails")
    assert WebhookEvent.objects.count() == before


def test_turn_end_and_approvals(create_session: Callable[..., str]) -> None:
    session_id = create_session(ALICE)
    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    approval = ask(session_id, turn=turn)
    [asked] = events("approval.requested")
    assert asked.data["approval"]["id"] == approval.id
    assert asked.data["response_id"] == turn.id and asked.session_id == session_id
    runner_events.fail_turn(session_id=session_id, response_id=turn.id, code="x", message="boom")
    [failed] = events("turn.failed")
    assert failed.data == {
        "session_id": session_id,
        "response_id": turn.id,
        "status": "failed",
        "error": {"code": "x", "message": "boom"},
        "usage": None,
    }
    # The turn's end cancelled its open question.
    [resolved] = events("approval.resolved")
    assert resolved.data["approval"]["status"] == "cancelled"


def test_runner_online_and_offline() -> None:
    owner = get_or_create_user(ALICE)
    runner, _token = services.register_runner(owner=owner, name="r")
    connection = services.mark_connected(
        runner_id=runner.id, channel_name="chan-1", runner_version="1", workspace={}
    )
    [online] = events("runner.online")
    assert online.owner_id == owner.pk and online.data == {"runner_id": runner.id}
    # A replacing connection is not a new "online".
    services.mark_connected(
        runner_id=runner.id, channel_name="chan-2", runner_version="1", workspace={}
    )
    assert len(events("runner.online")) == 1
    assert not services.mark_disconnected(runner_id=runner.id, generation=connection.generation)
    assert services.mark_disconnected(runner_id=runner.id, generation=connection.generation + 1)
    [offline] = events("runner.offline")
    assert offline.owner_id == owner.pk


@pytest.mark.parametrize(
    ("events", "enabled", "stored"),
    [
        (["*"], True, True),
        (["session.created"], True, True),
        (["turn.completed", "session.deleted"], True, False),
        (["*"], False, False),
    ],
)
def test_an_event_is_written_only_if_an_enabled_webhook_takes_its_type(
    create_session: Callable[..., str],
    webhook_subscriber: Webhook,
    events: list[str],
    enabled: bool,
    stored: bool,
) -> None:
    """Nobody would receive it otherwise (automation.md: the fan-out deletes such a row)."""
    Webhook.objects.filter(pk=webhook_subscriber.pk).update(events=events, enabled=enabled)
    with transaction.atomic():
        event = enqueue_webhook_event(type="session.created", data={"n": 1}, session_id="s_1")
    assert event.id.startswith("evt_") and event.type == "session.created"
    assert WebhookEvent.objects.filter(id=event.id).exists() is stored
    assert event._state.adding is not stored
    if stored:
        row = WebhookEvent.objects.get(id=event.id)
        assert (row.data, row.session_id, row.owner_id, row.audience, row.dispatched) == (
            {"n": 1},
            "s_1",
            None,
            None,
            False,
        )


def test_no_webhook_no_row(create_session: Callable[..., str]) -> None:
    Webhook.objects.all().delete()
    session_id = create_session(ALICE)
    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    runner_events.fail_turn(session_id=session_id, response_id=turn.id, code="x", message="boom")
    assert not WebhookEvent.objects.exists()
