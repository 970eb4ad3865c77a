"""The admin manages: permissions, a runner's bound sessions, a session's transcript,
turns and runner state (the first-hour issue's admin list)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from runners.models import Runner
from sessions.models import Item, Permission, Session, Turn

from .conftest import ALICE, BOB

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(django_user_model) -> APIClient:
    admin = django_user_model.objects.create_superuser(
        username="admin", email="admin@example.com", password="pw-for-admin"
    )
    client = APIClient()
    client.force_login(admin)
    return client


def change_url(model: type, pk: str) -> str:
    meta = model._meta  # type: ignore[attr-defined]
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[quote(pk)])


@pytest.fixture
def online_runner() -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id="runner_token_laptop",
        name="laptop",
        owner=get_or_create_user(ALICE),
        channel_name="specific.test!abc",
        connected_at=now,
        last_seen_at=now,
    )


def test_permissions_list_filters_by_user_session_and_level(
    admin_client, create_session, grant
) -> None:
    first = create_session(ALICE, title="first")
    second = create_session(ALICE, title="second")
    grant(first, BOB, 2)
    response = admin_client.get("/admin/agent_sessions/permission/")
    assert response.status_code == 200
    assert b"3 permissions" in response.content  # two owners and BOB's grant
    bob = Permission.objects.get(user__username=BOB)
    by_user = admin_client.get(f"/admin/agent_sessions/permission/?user__id__exact={bob.user_id}")
    assert b"1 permission" in by_user.content
    by_session = admin_client.get(f"/admin/agent_sessions/permission/?session__id__exact={second}")
    assert b"1 permission" in by_session.content
    by_level = admin_client.get("/admin/agent_sessions/permission/?level__exact=4")
    assert b"2 permissions" in by_level.content
    searched = admin_client.get(f"/admin/agent_sessions/permission/?q={BOB}")
    assert b"1 permission" in searched.content


def test_runner_page_lists_its_bound_sessions(admin_client, create_session, online_runner) -> None:
    bound = create_session(ALICE, title="bound-here")
    create_session(ALICE, title="not-bound")
    Session.objects.filter(pk=bound).update(runner=online_runner)
    response = admin_client.get(change_url(Runner, online_runner.pk))
    assert response.status_code == 200
    content = response.content.decode()
    assert "bound sessions" in content.lower()
    assert "bound-here" in content
    assert "not-bound" not in content


def test_session_list_shows_runner_online_state(
    admin_client, create_session, online_runner
) -> None:
    bound = create_session(ALICE, title="with-runner")
    Session.objects.filter(pk=bound).update(runner=online_runner)
    response = admin_client.get("/admin/agent_sessions/session/")
    content = response.content.decode()
    assert "runner online" in content.lower()
    assert 'src="/static/admin/img/icon-yes.svg"' in content
    Runner.objects.filter(pk=online_runner.pk).update(
        channel_name="", last_seen_at=timezone.now() - timedelta(hours=1)
    )
    content = admin_client.get("/admin/agent_sessions/session/").content.decode()
    assert 'src="/static/admin/img/icon-no.svg"' in content


def test_session_page_shows_transcript_in_order_and_turns(admin_client, create_session) -> None:
    session_id = create_session(ALICE, title="talk")
    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.create(
        session=session,
        status=Turn.Status.FAILED,
        error={"code": "llm_error", "message": "the model <b>refused</b>"},
    )
    rows = [
        ("message", {"role": "user", "content": [{"type": "input_text", "text": "write hi"}]}),
        (
            "function_call",
            {"name": "sys_os_write", "arguments": '{"path": "hi.txt"}', "call_id": "c1"},
        ),
        ("function_call_output", {"call_id": "c1", "output": "<script>alert(1)</script>"}),
        ("message", {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]}),
    ]
    for index, (kind, data) in enumerate(rows):
        Item.objects.create(
            id=f"item_{index}", session=session, response_id=turn.id, type=kind, data=data
        )
    response = admin_client.get(change_url(Session, session_id))
    assert response.status_code == 200
    content = response.content.decode()
    order = [content.index(text) for text in ("write hi", "sys_os_write", "output of c1", "done")]
    assert order == sorted(order)
    # Model and tool output is escaped, never markup.
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    # The turn with its status and error.
    assert turn.id in content
    assert "failed" in content
    assert "llm_error" in content
    assert "the model <b>refused</b>" not in content
