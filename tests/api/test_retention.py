"""Retention (lifecycle.md, Retention): archiving idle sessions and bringing them back,
deleting long-archived ones with what they own (but not bytes another session still
uses), event-log compaction, the dry-run command, the job claimed once per interval,
and the storage figures in the admin. The clock is the run's ``now``."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit import actions
from audit.models import AuditRecord
from omnigent_site.users import get_or_create_user
from runners import runner_events
from sessions import retention
from sessions.eventlog import record_event
from sessions.models import Agent, FileBlob, Item, RetentionRun, Session, SessionEvent, SessionFile

from .conftest import ALICE, assert_error
from .files_helpers import post_file

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture
def days(settings: Any) -> Any:
    settings.OMNIGENT_ARCHIVE_AFTER_DAYS = 30
    settings.OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS = 60
    settings.OMNIGENT_EVENT_LOG_KEEP_DAYS = 30
    return settings


def _idle_for(session_id: str, days: int) -> None:
    Session.objects.filter(pk=session_id).update(updated_at=timezone.now() - days * DAY)


def _listed(client: Any, **query: str) -> list[str]:
    return [row["id"] for row in client.get("/v1/sessions", query).json()["data"]]


def test_idle_sessions_are_archived_hidden_and_brought_back(
    days: Any, client_for: Any, create_session: Any
) -> None:
    idle, fresh, busy = create_session(), create_session(), create_session()
    _idle_for(idle, 31)
    _idle_for(busy, 31)
    Session.objects.filter(pk=busy).update(status=Session.Status.RUNNING)
    report = retention.run(now=timezone.now())
    assert report.archived_sessions == 1
    alice = client_for(ALICE)
    assert alice.get(f"/v1/sessions/{idle}").json()["archived"] is True
    assert set(_listed(alice)) == {fresh, busy}
    assert _listed(alice, archived="1") == [idle]
    assert_error(alice.get("/v1/sessions", {"archived": "maybe"}), 400, "invalid_input")
    # PATCH brings it back, and archives by hand.
    back = alice.patch(f"/v1/sessions/{idle}", {"archived": False}, format="json")
    assert back.status_code == 200 and back.json()["archived"] is False
    assert alice.patch(f"/v1/sessions/{fresh}", {"archived": True}, format="json").json()[
        "archived"
    ]
    assert _listed(alice, archived="1") == [fresh]
    # A message brings it back too.
    runner_events.accept_message(
        session_id=fresh,
        created_by=ALICE,
        data={"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        tools=[],
    )
    assert Session.objects.get(pk=fresh).archived_at is None


def test_long_archived_sessions_go_with_what_they_own(
    days: Any, client_for: Any, create_session: Any
) -> None:
    doomed, keeper = create_session(), create_session()
    alice = client_for(ALICE)
    for session_id in (doomed, keeper):
        assert post_file(alice, session_id, "same.txt", b"shared bytes").status_code == 201
    assert post_file(alice, doomed, "own.txt", b"only mine").status_code == 201
    Item.objects.create(session_id=doomed, id="item_1", type="message", data={"role": "user"})
    now = timezone.now()
    Session.objects.filter(pk=doomed).update(archived_at=now - 61 * DAY)
    Session.objects.filter(pk=keeper).update(archived_at=now - 59 * DAY)

    dry = retention.run(now=now, dry_run=True)
    assert (dry.deleted_sessions, dry.deleted_items, dry.deleted_files) == (1, 1, 2)
    assert dry.deleted_events == 2  # one ``resource.created`` per upload
    assert Session.objects.filter(pk=doomed).exists()

    report = retention.run(now=now)
    assert report.deleted_sessions == 1
    assert not Session.objects.filter(pk=doomed).exists()
    assert not SessionEvent.objects.filter(session_id=doomed).exists()
    assert list(SessionFile.objects.values_list("session_id", flat=True)) == [keeper]
    # The shared bytes stay for the other session; the doomed session's own go.
    assert FileBlob.objects.count() == 1
    record = AuditRecord.objects.get(action=actions.SESSION_DELETE)
    assert (record.actor, record.session_id, record.details["reason"]) == (
        None,
        doomed,
        "retention",
    )


def test_compaction_drops_old_events_but_the_last_ones(days: Any, create_session: Any) -> None:
    session_id = create_session()
    for index in range(12):
        record_event(session_id=session_id, payload={"type": "test.event", "n": index})
    now = timezone.now()
    SessionEvent.objects.filter(session_id=session_id, seq__lte=10).update(
        created_at=now - 31 * DAY
    )
    days.OMNIGENT_EVENT_RETENTION = 5
    # Old: 1..10; the last 5 (8..12) stay whatever their age: 1..7 go.
    assert retention.compact_event_logs(now=now, dry_run=True) == 7
    assert retention.compact_event_logs(now=now, dry_run=False) == 7
    seqs = SessionEvent.objects.filter(session_id=session_id).values_list("seq", flat=True)
    assert list(seqs.order_by("seq")) == list(range(8, 13))


def test_the_dry_run_command_reports_and_changes_nothing(days: Any, create_session: Any) -> None:
    idle = create_session()
    _idle_for(idle, 40)
    out = io.StringIO()
    call_command("retention", "--dry-run", stdout=out)
    assert "dry run" in out.getvalue()
    assert "sessions archived (would be): 1" in out.getvalue()
    assert Session.objects.get(pk=idle).archived_at is None
    out = io.StringIO()
    call_command("retention", "--json", stdout=out)
    assert json.loads(out.getvalue())["archived_sessions"] == 1
    assert Session.objects.get(pk=idle).archived_at is not None


def test_settings_at_zero_keep_everything(settings: Any, create_session: Any) -> None:
    settings.OMNIGENT_ARCHIVE_AFTER_DAYS = 0
    settings.OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS = 0
    idle = create_session()
    _idle_for(idle, 4000)
    Session.objects.filter(pk=idle).update(archived_at=timezone.now() - 4000 * DAY)
    report = retention.run(now=timezone.now())
    assert (report.archived_sessions, report.deleted_sessions) == (0, 0)
    assert Session.objects.filter(pk=idle).exists()


def test_an_agent_s_own_retention_wins(days: Any, create_session: Any) -> None:
    keep, quick, default = create_session(), create_session(), create_session()
    Agent.objects.filter(sessions__pk=keep).update(archive_after_days=0)
    Agent.objects.filter(sessions__pk=quick).update(
        archive_after_days=5, delete_archived_after_days=1
    )
    for session_id in (keep, quick, default):
        _idle_for(session_id, 10)
    now = timezone.now()
    assert retention.run(now=now).archived_sessions == 1
    assert Session.objects.get(pk=quick).archived_at is not None
    # A day later the quick agent's session goes; the others follow the server (60 days).
    Session.objects.filter(pk=default).update(archived_at=now)
    assert retention.run(now=now + 2 * DAY).deleted_sessions == 1
    assert set(Session.objects.values_list("id", flat=True)) == {keep, default}


def test_the_job_runs_once_per_interval(settings: Any) -> None:
    settings.OMNIGENT_RETENTION_INTERVAL_S = 86400
    now = timezone.now()
    assert retention.run_if_due(now=now, process="a") is not None
    assert retention.run_if_due(now=now, process="b") is None
    assert retention.run_if_due(now=now + 23 * timedelta(hours=1), process="b") is None
    later = retention.run_if_due(now=now + DAY, process="b")
    assert later is not None
    row = RetentionRun.objects.get()
    assert row.claimed_by == "b" and row.finished_at is not None
    assert row.report == later.as_dict()


def test_the_admin_shows_storage(client: Any, create_session: Any) -> None:
    session_id = create_session()
    record_event(session_id=session_id, payload={"type": "test.event"})
    admin = get_or_create_user("root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    listing = client.get("/admin/agent_sessions/session/")
    assert listing.status_code == 200
    assert b"Storage: 1 sessions (0 archived)" in listing.content
    detail = client.get(f"/admin/agent_sessions/session/{session_id}/change/")
    assert detail.status_code == 200
    assert b"1 events (" in detail.content
    totals = retention.storage_totals()
    assert totals["database_bytes"] and totals["events"] == 1


def _on_postgres() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("runs on PostgreSQL (make test-postgres)")


@pytest.mark.postgres
@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_two_workers_run_the_job_once_per_interval_on_postgres(settings: Any) -> None:
    """Two server processes' workers, each on its own connection, race for the run of
    each interval: exactly one of them runs it every time."""
    import threading

    from django.db import connection

    _on_postgres()
    settings.OMNIGENT_RETENTION_INTERVAL_S = 3600
    start = timezone.now()
    rounds = 10
    barrier = threading.Barrier(2, timeout=20)
    runs: dict[str, int] = {"a": 0, "b": 0}

    def worker(name: str) -> None:
        try:
            for index in range(rounds):
                barrier.wait()
                now = start + index * timedelta(hours=1)
                if retention.run_if_due(now=now, process=name) is not None:
                    runs[name] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(name,)) for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert runs["a"] + runs["b"] == rounds
