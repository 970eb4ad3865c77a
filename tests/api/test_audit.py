"""The audit log (lifecycle.md, Audit log): every audited act writes exactly one record
in its own transaction, an act whose record cannot be written does not happen, records
cannot be changed or deleted, and ``GET /v1/audit`` shows each caller what they may see."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.test import Client
from rest_framework.authtoken.models import Token

from audit import actions
from audit import services as audit_services
from audit.models import AuditImmutable, AuditRecord
from sessions.models import Permission, Session, Turn

from .conftest import ALICE, BOB, CAROL, assert_error, upload
from .files_helpers import post_file
from .test_approvals import ask

pytestmark = pytest.mark.django_db

RULES = [{"name": "no-shell", "tools": ["sys_os_shell"], "action": "deny"}]


def _resolve(client_for: Any, session_id: str) -> Any:
    approval = ask(session_id)
    return client_for(ALICE).post(
        f"/v1/sessions/{session_id}/elicitations/{approval.id}/resolve",
        {"action": "decline", "reason": "not now"},
        format="json",
    )


def _grant(client_for: Any, session_id: str) -> Any:
    return client_for(ALICE).put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": BOB, "level": 2}, format="json"
    )


def _revoke(client_for: Any, session_id: str) -> Any:
    Permission.objects.create(
        session_id=session_id, user=get_user_model().objects.create(username=BOB), level=1
    )
    return client_for(ALICE).delete(f"/v1/sessions/{session_id}/permissions/{BOB}")


def _policies(client_for: Any, session_id: str) -> Any:
    return client_for(ALICE).put(
        f"/v1/sessions/{session_id}/policies", {"rules": RULES}, format="json"
    )


def _register(client_for: Any, session_id: str) -> Any:
    return client_for(ALICE).post("/v1/runners", {"name": "box"}, format="json")


def _revoke_runner(client_for: Any, session_id: str) -> Any:
    from omnigent_site.users import get_or_create_user
    from runners.services import register_runner

    runner, _ = register_runner(owner=get_or_create_user(ALICE), name="box")
    AuditRecord.objects.filter(action=actions.RUNNER_REGISTER)  # registered above: one record
    return client_for(ALICE).delete(f"/v1/runners/{runner.id}")


def _delete_session(client_for: Any, session_id: str) -> Any:
    return client_for(ALICE).delete(f"/v1/sessions/{session_id}")


def _delete_agent(client_for: Any, session_id: str) -> Any:
    created = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(_bundle("tmpl"))}, format="multipart"
    )
    assert created.status_code == 201, created.content
    return client_for(ALICE).delete(f"/v1/agents/{created.json()['id']}")


def _delete_file(client_for: Any, session_id: str) -> Any:
    posted = post_file(client_for(ALICE), session_id, "notes.txt", b"hello")
    assert posted.status_code == 201, posted.content
    return client_for(ALICE).delete(
        f"/v1/sessions/{session_id}/resources/files/{posted.json()['id']}"
    )


def _bundle(name: str) -> bytes:
    from omnigent_runner.bundles import build_bundle

    from ..conftest import agent_yaml

    return build_bundle({"agent.yaml": agent_yaml(name)})


def _webhook(client_for: Any, change: str) -> Any:
    from django.test import override_settings

    alice = client_for(ALICE)
    with override_settings(OMNIGENT_WEBHOOK_ALLOW_HTTP=True, OMNIGENT_WEBHOOK_ALLOW_PRIVATE=True):
        created = alice.post(
            "/v1/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ["*"]}, format="json"
        )
        if change == "created":
            return created
        path = f"/v1/webhooks/{created.json()['id']}"
        if change == "updated":
            return alice.patch(path, {"description": "ci"}, format="json")
        if change == "secret rotated":
            return alice.post(f"{path}/rotate-secret")
        return alice.delete(path)


WEBHOOK_CHANGES = {"created": 201, "updated": 200, "secret rotated": 200, "deleted": 200}


@pytest.mark.parametrize("change", list(WEBHOOK_CHANGES))
def test_every_webhook_change_writes_one_record(change: str, client_for: Any) -> None:
    response = _webhook(client_for, change)
    assert response.status_code == WEBHOOK_CHANGES[change], response.content
    # Records are append-only (a trigger on PostgreSQL): the change's record is the last.
    records = AuditRecord.objects.filter(action=actions.WEBHOOK_CHANGE).order_by("pk")
    assert records.count() == (1 if change == "created" else 2)
    record = records.last()
    assert record is not None
    assert (record.action, record.actor, record.details["change"]) == (
        actions.WEBHOOK_CHANGE,
        ALICE,
        change,
    )
    from webhooks.models import Webhook

    for webhook in Webhook.objects.all():
        assert webhook.secret not in json.dumps(record.details)


ACTS: dict[str, tuple[Callable[[Any, str], Any], int]] = {
    actions.APPROVAL_VERDICT: (_resolve, 202),
    actions.PERMISSION_GRANT: (_grant, 200),
    actions.PERMISSION_REVOKE: (_revoke, 204),
    actions.POLICY_CHANGE: (_policies, 200),
    actions.RUNNER_REGISTER: (_register, 201),
    actions.RUNNER_REVOKE: (_revoke_runner, 200),
    actions.SESSION_DELETE: (_delete_session, 200),
    actions.AGENT_DELETE: (_delete_agent, 200),
    actions.FILE_DELETE: (_delete_file, 200),
}


@pytest.mark.parametrize("action", list(ACTS))
def test_every_audited_act_writes_exactly_one_record(
    action: str, client_for: Any, create_session: Any
) -> None:
    session_id = create_session(ALICE)
    before = set(AuditRecord.objects.values_list("pk", flat=True))
    act, status = ACTS[action]
    response = act(client_for, session_id)
    assert response.status_code == status, response.content
    new = AuditRecord.objects.exclude(pk__in=before).filter(action=action)
    assert new.count() == 1
    record = new.get()
    assert record.actor == ALICE
    if action not in (actions.RUNNER_REGISTER, actions.RUNNER_REVOKE, actions.AGENT_DELETE):
        assert record.session_id == session_id
    listed = client_for(ALICE).get("/v1/audit", {"action": action}).json()["data"]
    assert [row["id"] for row in listed] == [f"aud_{record.pk}"]


def test_a_verdict_records_who_the_tool_the_arguments_hash_and_the_reason(
    client_for: Any, create_session: Any
) -> None:
    session_id = create_session(ALICE)
    assert _resolve(client_for, session_id).status_code == 202
    row = client_for(ALICE).get("/v1/audit", {"action": actions.APPROVAL_VERDICT}).json()
    details = row["data"][0]["details"]
    assert details["tool"] == "sys_os_shell"
    assert details["verdict"] == "declined" and details["reason"] == "not now"
    assert details["arguments_sha256"] == audit_services.arguments_sha256(
        {"command": "rm -rf build"}
    )
    assert row["data"][0]["target_type"] == "elicitation"


def test_sign_ins_tokens_are_recorded(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = get_user_model().objects.create_user("dana", password="pw-dana")
    for password in ("wrong", "pw-dana"):
        browser = Client()
        browser.get("/signin")
        browser.post("/signin", {"username": "dana", "password": password})
    assert list(AuditRecord.objects.filter(target_id="dana").values_list("action", "actor")) == [
        (actions.SIGNIN_FAILED, None),
        (actions.SIGNIN, "dana"),
    ]
    failed = AuditRecord.objects.get(action=actions.SIGNIN_FAILED)
    assert "wrong" not in json.dumps(failed.details)
    token = Token.objects.create(user=user)
    token.delete()
    assert list(
        AuditRecord.objects.filter(target_type="token").values_list("action", flat=True)
    ) == [actions.TOKEN_CREATE, actions.TOKEN_REVOKE]


def test_an_act_whose_record_fails_does_not_happen(
    client_for: Any, create_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = create_session(ALICE)
    approval = ask(session_id)

    def broken(**_: Any) -> None:
        raise DatabaseError("audit table unavailable")

    monkeypatch.setattr(audit_services, "record", broken)
    alice = client_for(ALICE)
    alice.raise_request_exception = False
    for response in (
        _grant(client_for, session_id),
        alice.post(
            f"/v1/sessions/{session_id}/elicitations/{approval.id}/resolve",
            {"action": "accept"},
            format="json",
        ),
        _policies(client_for, session_id),
        alice.delete(f"/v1/sessions/{session_id}"),
    ):
        assert response.status_code == 500
    session = Session.objects.get(pk=session_id)
    assert not Permission.objects.filter(session=session, user__username=BOB).exists()
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert session.policy_rules == []
    assert AuditRecord.objects.count() == 0


def test_records_cannot_be_changed_or_deleted() -> None:
    record = audit_services.record(
        actor=ALICE, action=actions.SESSION_DELETE, target_type="session", target_id="conv_x"
    )
    record.actor = BOB
    with pytest.raises(AuditImmutable):
        record.save()
    with pytest.raises(AuditImmutable):
        record.delete()
    with pytest.raises(AuditImmutable):
        AuditRecord.objects.filter(pk=record.pk).update(actor=BOB)
    with pytest.raises(AuditImmutable):
        AuditRecord.objects.all().delete()
    # Past the ORM, the database itself refuses the change.
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditrecord SET actor = %s", [BOB])
    assert AuditRecord.objects.get().actor == ALICE


def test_only_the_retention_deletes_records(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    for days, target in ((400, "old"), (10, "recent")):
        monkeypatch.setattr(audit_services, "clock", lambda days=days: now - timedelta(days=days))
        audit_services.record(
            actor=ALICE, action=actions.SESSION_DELETE, target_type="session", target_id=target
        )
    cutoff = audit_services.purge_cutoff(now=now)
    assert cutoff == now - timedelta(days=365)
    assert audit_services.purge_older_than(cutoff=cutoff, dry_run=True) == 1
    assert audit_services.purge_older_than(cutoff=cutoff) == 1
    assert list(AuditRecord.objects.values_list("target_id", flat=True)) == ["recent"]


def test_who_sees_what(client_for: Any, create_session: Any, grant: Any) -> None:
    mine = create_session(ALICE)
    grant(mine, BOB, 2)  # alice's act on alice's session
    grant(mine, CAROL, 3)  # carol manages it
    bobs = create_session(BOB)
    grant(bobs, CAROL, 1, by=BOB)  # bob's act on bob's session
    ids = lambda who, **query: [  # noqa: E731
        row["target_id"] for row in client_for(who).get("/v1/audit", query).json()["data"]
    ]
    assert ids(ALICE) == [CAROL, BOB]
    assert ids(BOB) == [CAROL]
    # Carol manages alice's session, so she sees the acts on it, not bob's.
    assert ids(CAROL) == [CAROL, BOB]
    assert ids(CAROL, session_id=bobs) == []
    assert ids(BOB, session_id=mine) == []
    staff = get_user_model().objects.create(username="root@example.com", is_staff=True)
    assert ids(staff.username) == [CAROL, CAROL, BOB]
    assert ids(staff.username, actor=BOB) == [CAROL]
    assert ids(staff.username, order="asc", session_id=mine) == [BOB, CAROL]


def test_cursors_filters_and_the_jsonl_stream(client_for: Any) -> None:
    for n in range(5):
        audit_services.record(
            actor=ALICE, action=actions.RUNNER_REGISTER, target_type="runner", target_id=str(n)
        )
    alice = client_for(ALICE)
    first = alice.get("/v1/audit", {"limit": 2, "order": "asc"}).json()
    assert [row["target_id"] for row in first["data"]] == ["0", "1"] and first["has_more"]
    second = alice.get("/v1/audit", {"limit": 2, "order": "asc", "after": first["last_id"]})
    assert [row["target_id"] for row in second.json()["data"]] == ["2", "3"]
    assert alice.get("/v1/audit", {"since": "2000-01-01T00:00:00Z"}).json()["data"]
    assert alice.get("/v1/audit", {"until": "946684800"}).json()["data"] == []
    assert_error(alice.get("/v1/audit", {"since": "yesterday"}), 400, "invalid_input")
    assert_error(alice.get("/v1/audit", {"after": "x"}), 400, "invalid_input")
    stream = alice.get("/v1/audit", {"format": "jsonl", "order": "asc"})
    assert stream.status_code == 200 and stream["Content-Type"].startswith("application/jsonl")
    lines = b"".join(stream).decode().splitlines()
    assert [json.loads(line)["target_id"] for line in lines] == ["0", "1", "2", "3", "4"]
    assert alice.get("/v1/audit").status_code == 200
    assert_error(client_for(None).get("/v1/audit"), 401, "unauthorized")
    # `format` is the endpoint's own parameter: an unknown value and a bad filter of a
    # stream request are 400s in the JSON error format.
    assert_error(alice.get("/v1/audit", {"format": "AAA"}), 400, "invalid_input")
    bad_stream = alice.get("/v1/audit", {"format": "jsonl", "since": "NUL"})
    assert_error(bad_stream, 400, "invalid_input")
    assert bad_stream["Content-Type"].startswith("application/json")


def test_the_admin_shows_records_read_only(client_for: Any) -> None:
    from django.contrib import admin

    from audit.admin import AuditRecordAdmin

    model_admin = AuditRecordAdmin(AuditRecord, admin.site)
    request: Any = type("R", (), {"user": None})()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)


def test_turn_end_cancellation_and_expiry_are_recorded_without_a_person(
    create_session: Any,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from sessions import approvals

    session_id = create_session(ALICE)
    turn = Turn.objects.create(session_id=session_id, status=Turn.Status.IN_PROGRESS)
    due = ask(session_id, turn=turn, call_id="c1")
    ask(session_id, turn=turn, call_id="c2")
    type(due).objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert len(approvals.expire_due()) == 1
    assert len(approvals.cancel_pending(session_id=session_id, reason="turn ended")) == 1
    verdicts = AuditRecord.objects.filter(action=actions.APPROVAL_VERDICT).order_by("pk")
    assert [(r.actor, r.details["verdict"]) for r in verdicts] == [
        (None, "expired"),
        (None, "cancelled"),
    ]


@pytest.mark.postgres
def test_the_postgres_trigger_refuses_deletes_except_the_retentions() -> None:
    from datetime import timedelta

    from django.utils import timezone

    if connection.vendor != "postgresql":
        pytest.skip("runs on PostgreSQL (make test-postgres)")
    audit_services.record(
        actor=ALICE, action=actions.SESSION_DELETE, target_type="session", target_id="a"
    )
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_auditrecord")
    cutoff = timezone.now() + timedelta(seconds=1)
    assert audit_services.purge_older_than(cutoff=cutoff) == 1
    assert AuditRecord.objects.count() == 0
