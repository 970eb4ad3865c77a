"""The admin manages: permissions, a runner's bound sessions, a session's transcript,
turns and runner state (the first-hour issue's admin list)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditRecord
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


# --- grants edited in the admin are audited (lifecycle.md, Audit log) --------------------


def admin_records(action: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=action).order_by("at", "id"))


def test_a_grant_added_changed_and_deleted_in_the_admin_is_audited(
    admin_client, create_session
) -> None:
    session_id = create_session(ALICE)
    bob = get_or_create_user(BOB)
    added = admin_client.post(
        "/admin/agent_sessions/permission/add/",
        {"user": bob.pk, "session": session_id, "level": 1},
    )
    assert added.status_code == 302, added.content
    grant = Permission.objects.get(session_id=session_id, user=bob)
    [record] = admin_records("permission.grant")
    assert (record.actor, record.target_id, record.session_id) == ("admin", BOB, session_id)
    assert record.details == {"level": 1, "previous_level": None, "via": "admin"}

    changed = admin_client.post(
        change_url(Permission, str(grant.pk)),
        {"user": bob.pk, "session": session_id, "level": 3},
    )
    assert changed.status_code == 302, changed.content
    assert admin_records("permission.grant")[-1].details == {
        "level": 3,
        "previous_level": 1,
        "via": "admin",
    }

    meta = Permission._meta
    deleted = admin_client.post(
        reverse(f"admin:{meta.app_label}_{meta.model_name}_delete", args=[grant.pk]),
        {"post": "yes"},
    )
    assert deleted.status_code == 302, deleted.content
    assert not Permission.objects.filter(pk=grant.pk).exists()
    [revoked] = admin_records("permission.revoke")
    assert (revoked.actor, revoked.target_id, revoked.session_id) == ("admin", BOB, session_id)
    assert revoked.details == {"level": 3, "via": "admin"}


def test_a_grant_moved_to_another_user_is_a_revocation_and_a_grant(
    admin_client, create_session, grant
) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 2)
    carol = get_or_create_user("carol")
    bobs = Permission.objects.get(session_id=session_id, user__username=BOB)
    moved = admin_client.post(
        change_url(Permission, str(bobs.pk)),
        {"user": carol.pk, "session": session_id, "level": 2},
    )
    assert moved.status_code == 302, moved.content
    assert admin_records("permission.revoke")[-1].target_id == BOB
    last_grant = admin_records("permission.grant")[-1]
    assert (last_grant.target_id, last_grant.details["previous_level"]) == ("carol", None)


def test_grants_deleted_in_bulk_from_the_list_are_each_audited(
    admin_client, create_session, grant
) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    grant(session_id, "carol", 2)
    pks = list(
        Permission.objects.filter(session_id=session_id, level__lt=4).values_list("pk", flat=True)
    )
    response = admin_client.post(
        "/admin/agent_sessions/permission/",
        {"action": "delete_selected", "_selected_action": pks, "post": "yes"},
    )
    assert response.status_code == 302, response.content
    revoked = sorted(record.target_id for record in admin_records("permission.revoke"))
    assert revoked == [BOB, "carol"]


def form_fields(html: str) -> dict[str, list[str]]:
    """The values a browser would submit for the admin's change form, as the page holds them."""
    from html.parser import HTMLParser

    fields: dict[str, list[str]] = {}

    class Form(HTMLParser):
        select: str | None = None
        textarea: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = dict(attrs)
            name = a.get("name")
            if tag == "input" and name and a.get("type") not in {"submit", "button", "file"}:
                if a.get("type") == "checkbox" and "checked" not in a:
                    return
                fields.setdefault(name, []).append(a.get("value") or "")
            elif tag == "select" and name:
                self.select = name
            elif tag == "option" and self.select and "selected" in a:
                fields.setdefault(self.select, []).append(a.get("value") or "")
            elif tag == "textarea" and name:
                self.textarea = name
                fields.setdefault(name, []).append("")

        def handle_endtag(self, tag: str) -> None:
            if tag == "select":
                self.select = None
            if tag == "textarea":
                self.textarea = None

        def handle_data(self, data: str) -> None:
            if self.textarea:  # a browser drops the newline that opens a textarea
                fields[self.textarea][-1] += data.removeprefix("\n")

    Form().feed(html)
    return fields


def test_grants_changed_in_the_session_pages_inline_are_audited(
    admin_client, create_session, grant
) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    url = change_url(Session, session_id)
    fields = form_fields(admin_client.get(url).content.decode())
    fields = {name: value for name, value in fields.items() if "__prefix__" not in name}
    prefix = "grants"  # the related name of the session's permissions
    rows = int(fields[f"{prefix}-TOTAL_FORMS"][0])
    bob_row = next(i for i in range(rows) if fields[f"{prefix}-{i}-level"] == ["1"])
    fields[f"{prefix}-{bob_row}-DELETE"] = ["on"]
    response = admin_client.post(url, fields)
    assert response.status_code == 302, response.content[:3000]
    assert not Permission.objects.filter(session_id=session_id, user__username=BOB).exists()
    [revoked] = admin_records("permission.revoke")
    assert (revoked.target_id, revoked.details["via"]) == (BOB, "admin")
