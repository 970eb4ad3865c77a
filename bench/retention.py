"""Benchmark: retention and the audit write (lifecycle.md; issue 41, "Measured").

1. Retention of ``--sessions`` sessions (10,000), each with ``--items`` items, ``--events``
   events and a grant, all idle for 100 days: one run archives them, a second run (the
   clock moved past the deletion age) deletes them with everything they own, through
   ``services.delete_session`` as a ``DELETE`` would. Times of each run, the database's
   size before, after the deletion and after ``VACUUM`` (SQLite gives the freed pages
   back to the file only on ``VACUUM``; PostgreSQL's plain ``VACUUM`` makes the space
   reusable without shrinking the files, so its size is reported as it is).
2. The cost of the audit record on the approval path (``approvals.resolve``) and the
   grant path (``services.grant_permission``): each call timed with the record written
   and with ``audit.services.record`` replaced by a no-op, interleaved in batches so
   machine drift hits both alike; p50/p95 per call and the difference of the medians.

Runs in this process on a fresh SQLite file, or with ``--database postgres`` on a fresh
PostgreSQL database (created and dropped). Run: ``.venv/bin/python -m bench.retention
[--sessions 10000] [--calls 400] [--database sqlite|postgres]``. The last line printed
is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench._stats import summary_ms

USER = "bench@example.com"


@contextlib.contextmanager
def django_project(tmp: Path, database_url: str) -> Iterator[None]:
    """The project configured in this process on ``database_url``, production-like."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="omnigent_site.settings",
        DATABASE_URL=database_url,
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(48),
        OMNIGENT_DATA_DIR=str(tmp / "data"),
        OMNIGENT_LOG_LEVEL="WARNING",
        OMNIGENT_ARCHIVE_AFTER_DAYS="30",
        OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS="30",
        OMNIGENT_EVENT_LOG_KEEP_DAYS="30",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield


def populate(*, sessions: int, items: int, events: int) -> None:
    """``sessions`` sessions (each with its private agent, owner grant, items and events),
    written in bulk, all last updated 100 days ago."""
    from django.db import transaction
    from django.utils import timezone

    from omnigent_site.users import get_or_create_user
    from sessions.models import Agent, Item, Permission, Session, SessionEvent

    user = get_or_create_user(USER)
    old = timezone.now() - timedelta(days=100)
    batch = 500
    for start in range(0, sessions, batch):
        count = min(batch, sessions - start)
        with transaction.atomic():
            agents = Agent.objects.bulk_create(
                [
                    Agent(
                        kind=Agent.Kind.SESSION,
                        name="bench",
                        bundle_sha256="0" * 64,
                        bundle_size=1,
                        created_by=user,
                    )
                    for _ in range(count)
                ]
            )
            rows = Session.objects.bulk_create(
                [
                    Session(agent=agent, title=f"bench {start + i}", created_by=user)
                    for i, agent in enumerate(agents)
                ]
            )
            Permission.objects.bulk_create(
                [Permission(session=row, user=user, level=Permission.Level.OWNER) for row in rows]
            )
            Item.objects.bulk_create(
                [
                    Item(
                        session=row,
                        id=f"item_{n}",
                        type="message",
                        data={
                            "role": "user",
                            "content": [{"type": "input_text", "text": "hello " * 20}],
                        },
                    )
                    for row in rows
                    for n in range(items)
                ]
            )
            SessionEvent.objects.bulk_create(
                [
                    SessionEvent(
                        session=row,
                        seq=n + 1,
                        type="response.output_text.delta",
                        payload={"type": "response.output_text.delta", "delta": "word " * 10},
                    )
                    for row in rows
                    for n in range(events)
                ]
            )
            ids = [row.id for row in rows]
            Session.objects.filter(id__in=ids).update(updated_at=old, last_event_seq=events)
            SessionEvent.objects.filter(session_id__in=ids).update(created_at=old)


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM")


def bench_retention(*, sessions: int, items: int, events: int) -> dict[str, Any]:
    from django.utils import timezone

    from sessions import retention
    from sessions.models import Session

    print(f"populating {sessions} sessions…", file=sys.stderr)
    started = time.perf_counter()
    populate(sessions=sessions, items=items, events=events)
    result: dict[str, Any] = {
        "sessions": sessions,
        "items_per_session": items,
        "events_per_session": events,
        "populate_s": round(time.perf_counter() - started, 1),
    }
    vacuum()
    result["db_bytes_before"] = retention.database_bytes()
    now = timezone.now()
    dry_started = time.perf_counter()
    retention.run(now=now + timedelta(days=31), dry_run=True)
    result["dry_run_s"] = round(time.perf_counter() - dry_started, 2)
    started = time.perf_counter()
    report = retention.run(now=now)
    result["archive_run_s"] = round(time.perf_counter() - started, 2)
    result["archived"] = report.archived_sessions
    print(f"  archived {report.archived_sessions} in {result['archive_run_s']} s", file=sys.stderr)
    started = time.perf_counter()
    report = retention.run(now=now + timedelta(days=31))
    elapsed = time.perf_counter() - started
    result["delete_run_s"] = round(elapsed, 1)
    result["deleted"] = report.as_dict()
    result["delete_ms_per_session"] = round(elapsed * 1000 / max(report.deleted_sessions, 1), 2)
    print(f"  deleted {report.deleted_sessions} in {elapsed:.1f} s", file=sys.stderr)
    assert Session.objects.count() == 0
    result["db_bytes_after_delete"] = retention.database_bytes()
    started = time.perf_counter()
    vacuum()
    result["vacuum_s"] = round(time.perf_counter() - started, 2)
    result["db_bytes_after_vacuum"] = retention.database_bytes()
    return result


def _interleaved(
    calls: int, batch: int, timed: Callable[[bool], float]
) -> tuple[list[float], list[float]]:
    """Per-call seconds with the audit record written and without, in alternating batches."""
    with_record: list[float] = []
    without: list[float] = []
    for start in range(0, calls, batch):
        for audited in (True, False) if (start // batch) % 2 == 0 else (False, True):
            target = with_record if audited else without
            target.extend(timed(audited) for _ in range(min(batch, calls - start)))
    return with_record, without


@contextlib.contextmanager
def audit_writes(enabled: bool) -> Iterator[None]:
    from unittest import mock

    from audit import services as audit_services

    if enabled:
        yield
        return
    with mock.patch.object(audit_services, "record", lambda **_: None):
        yield


def bench_audit_cost(*, calls: int, batch: int = 25) -> dict[str, Any]:
    from omnigent_runner import protocol
    from omnigent_site.users import get_or_create_user
    from sessions import approvals, services
    from sessions.models import Agent, Turn

    user = get_or_create_user(USER)
    agent = Agent.objects.create(
        kind=Agent.Kind.TEMPLATE, name="audit-bench", bundle_sha256="1" * 64, bundle_size=1
    )
    session = services.create_session(user=user, agent=agent)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    counter = iter(range(10**9))

    def approval_call(audited: bool) -> float:
        n = next(counter)
        event = protocol.ApprovalRequested(
            response_id=turn.id,
            call_id=f"call_{n}",
            tool="sys_os_shell",
            arguments={"command": f"make {n}"},
            policy_name="ask",
            reason="",
            ask_timeout=600.0,
        )
        approval = approvals.record_requested(session=session, turn=turn, event=event).approval
        with audit_writes(audited):
            started = time.perf_counter()
            approvals.resolve(
                session_id=session.id, approval_id=approval.id, action="accept", user=user
            )
            return time.perf_counter() - started

    users = [get_or_create_user(f"grantee{n}@example.com") for n in range(calls * 2 + batch + 2)]
    grantees = iter(users)

    def grant_call(audited: bool) -> float:
        target = next(grantees).get_username()
        with audit_writes(audited):
            started = time.perf_counter()
            services.grant_permission(session=session, actor=user, user_id=target, level=1)
            return time.perf_counter() - started

    result: dict[str, Any] = {}
    for name, timed in (("approval_resolve", approval_call), ("grant_permission", grant_call)):
        for _ in range(batch):  # warm up
            timed(True)
        with_record, without = _interleaved(calls, batch, timed)
        audited_ms = summary_ms(with_record)
        plain_ms = summary_ms(without)
        result[name] = {
            "with_audit_ms": audited_ms,
            "without_audit_ms": plain_ms,
            "p50_difference_ms": round(audited_ms["p50_ms"] - plain_ms["p50_ms"], 3),
        }
        print(f"  {name}: {result[name]}", file=sys.stderr)
    return result


@contextlib.contextmanager
def database(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp / 'retention.sqlite3'}"
        return
    from testing.processes import postgres_database

    with postgres_database("omnigent_bench_retention_") as url:
        yield url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="omnigent-bench-retention-") as tmp:
        with database(args.database, Path(tmp)) as url, django_project(Path(tmp), url):
            result: dict[str, Any] = {"database": args.database}
            result["retention"] = bench_retention(
                sessions=args.sessions, items=args.items, events=args.events
            )
            print("audit write cost…", file=sys.stderr)
            result["audit_write"] = bench_audit_cost(calls=args.calls)
            from django.db import connections

            connections.close_all()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
