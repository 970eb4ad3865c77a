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
from webhook_outbox.events import enqueue_webhook_event
from webhook_outbox.models import WebhookEvent

pytestmark = pytest.mark.django_db


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
