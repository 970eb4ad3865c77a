"""Retention (lifecycle.md, Retention): what leaves the database, and when.

One run, ``run``, does four things in order:

1. archives the sessions idle (``updated_at``) for ``OMNIGENT_ARCHIVE_AFTER_DAYS``;
2. deletes the sessions archived for ``OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS``, through
   ``services.delete_session`` (items, turns, events, grants, changes, files no other
   session refers to, the private agent; one audit record each, by nobody);
3. compacts event logs: events older than ``OMNIGENT_EVENT_LOG_KEEP_DAYS`` go, except
   each session's last ``OMNIGENT_EVENT_RETENTION`` (1,000). Only a prefix of a log is
   ever removed, so a stream resumed from an id before what is kept finds the gap and
   sends ``session.resync`` (``sessions/stream.py``), never a silent gap. The snapshot
   is built from items and turns, never from events, so it needs none of them;
4. deletes audit records older than ``OMNIGENT_AUDIT_KEEP_DAYS`` (``audit.services``).

A setting of 0 (or unset) turns its step off. ``manage.py retention --dry-run`` reports
what a run would remove and removes nothing. Every server process runs
``retention_forever``; the job's row (``RetentionRun``) is claimed with one conditional
``UPDATE``, so a run happens once per ``OMNIGENT_RETENTION_INTERVAL_S`` across processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Max, Q, Sum
from django.db.models.fields import TextField
from django.db.models.functions import Cast, Length
from django.utils import timezone

from audit import services as audit

from . import services
from .models import Agent, Item, RetentionRun, Session, SessionEvent, SessionFile

log = logging.getLogger(__name__)

JOB = "retention"
# Sessions deleted per database read of the candidates.
DELETE_BATCH = 200

# The time retention runs at; tests put a clock of their own here.
clock: Callable[[], datetime] = timezone.now

PROCESS = f"{socket.gethostname()}:{os.getpid()}"[:64]


@dataclass
class Report:
    """What a run removed (or, dry, would remove)."""

    dry_run: bool
    archived_sessions: int = 0
    deleted_sessions: int = 0
    deleted_items: int = 0
    deleted_events: int = 0
    deleted_files: int = 0
    compacted_events: int = 0
    deleted_audit_records: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _days(name: str) -> int:
    return max(int(getattr(settings, name)), 0)


def _by_agent_setting(field: str, setting: str) -> list[tuple[Q, int]]:
    """(which sessions, days) for each value of an agent's retention field in use: the
    sessions of agents without one follow the server's setting. 0 days: never."""
    groups = [(Q(**{f"agent__{field}__isnull": True}), _days(setting))]
    values = (
        Agent.objects.filter(**{f"{field}__isnull": False})
        .values_list(field, flat=True)
        .distinct()
        .order_by()
    )
    groups += [(Q(**{f"agent__{field}": value}), int(value)) for value in values]
    return [(which, days) for which, days in groups if days > 0]


# --- the steps ------------------------------------------------------------------------


def archive_idle(*, now: datetime, dry_run: bool) -> int:
    """Archive the sessions idle for ``OMNIGENT_ARCHIVE_AFTER_DAYS`` (or their agent's
    ``archive_after_days``); returns how many.

    Busy sessions (running, waiting) are left alone whatever their age. ``updated_at``
    does not move: the row shape (and so the ETag) carries ``archived``.
    """
    archived = 0
    for which, days in _by_agent_setting("archive_after_days", "OMNIGENT_ARCHIVE_AFTER_DAYS"):
        idle = Session.objects.filter(
            which,
            archived_at__isnull=True,
            updated_at__lt=now - timedelta(days=days),
            status__in=(Session.Status.IDLE, Session.Status.FAILED),
        )
        archived += idle.count() if dry_run else idle.update(archived_at=now)
    return archived


def _due_for_deletion(now: datetime) -> Any:
    groups = _by_agent_setting("delete_archived_after_days", "OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS")
    if not groups:
        return None
    due = Q()
    for which, days in groups:
        due |= which & Q(archived_at__lt=now - timedelta(days=days))
    return Session.objects.filter(due)


def delete_archived(*, now: datetime, dry_run: bool, report: Report) -> None:
    """Delete the sessions archived for ``OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS``."""
    due = _due_for_deletion(now)
    if due is None:
        return
    if dry_run:
        report.deleted_sessions += due.count()
        _count_owned(report, ids=due.values("id"))
        return
    failed: set[str] = set()
    while True:
        batch = due.exclude(id__in=failed).order_by("archived_at", "id")
        ids = list(batch.values_list("id", flat=True)[:DELETE_BATCH])
        if not ids:
            return
        report.deleted_sessions += len(ids)
        _count_owned(report, ids=ids)
        for session in Session.objects.filter(id__in=ids).select_related("agent"):
            try:
                services.delete_session(session=session, actor=None, reason="retention")
            except Exception:
                log.exception("retention: could not delete session %s", session.id)
                failed.add(session.id)
                report.deleted_sessions -= 1


def _count_owned(report: Report, *, ids: Any) -> None:
    report.deleted_items += Item.objects.filter(session_id__in=ids).count()
    report.deleted_events += SessionEvent.objects.filter(session_id__in=ids).count()
    report.deleted_files += SessionFile.objects.filter(session_id__in=ids).count()


def compact_event_logs(*, now: datetime, dry_run: bool) -> int:
    """Drop each session's events older than ``OMNIGENT_EVENT_LOG_KEEP_DAYS`` but its last
    ``OMNIGENT_EVENT_RETENTION``; returns how many. Only a prefix of each log goes."""
    days = _days("OMNIGENT_EVENT_LOG_KEEP_DAYS")
    if not days:
        return 0
    keep = max(int(settings.OMNIGENT_EVENT_RETENTION), 1)
    old = (
        SessionEvent.objects.filter(created_at__lt=now - timedelta(days=days))
        .filter(seq__lte=F("session__last_event_seq") - keep)
        .values("session_id")
        .annotate(upto=Max("seq"))
        .order_by()
    )
    removed = 0
    for row in old:
        prefix = SessionEvent.objects.filter(session_id=row["session_id"], seq__lte=row["upto"])
        if dry_run:
            removed += prefix.count()
        else:
            removed += prefix.delete()[0]
    return removed


def run(*, now: datetime | None = None, dry_run: bool = False) -> Report:
    """One retention run (every step); ``dry_run`` only counts."""
    now = now or clock()
    report = Report(dry_run=dry_run)
    report.archived_sessions = archive_idle(now=now, dry_run=dry_run)
    delete_archived(now=now, dry_run=dry_run, report=report)
    report.compacted_events = compact_event_logs(now=now, dry_run=dry_run)
    cutoff = audit.purge_cutoff(now=now)
    if cutoff is not None:
        report.deleted_audit_records = audit.purge_older_than(cutoff=cutoff, dry_run=dry_run)
    return report


# --- once across processes ------------------------------------------------------------


def interval() -> timedelta:
    return timedelta(seconds=max(float(settings.OMNIGENT_RETENTION_INTERVAL_S), 1.0))


def claim(*, now: datetime, process: str = PROCESS) -> bool:
    """Take this interval's run if it is due and nobody took it: True for one caller."""
    try:
        with transaction.atomic():
            RetentionRun.objects.get_or_create(name=JOB, defaults={"due_at": now})
    except IntegrityError:
        pass  # another process created the row meanwhile
    won = RetentionRun.objects.filter(name=JOB, due_at__lte=now).update(
        due_at=now + interval(), claimed_by=process, started_at=now, finished_at=None
    )
    return won == 1


def run_if_due(*, now: datetime | None = None, process: str = PROCESS) -> Report | None:
    """Run retention if this process claims the due run; None when not due or taken."""
    now = now or clock()
    if not claim(now=now, process=process):
        return None
    report = run(now=now)
    RetentionRun.objects.filter(name=JOB, claimed_by=process).update(
        finished_at=clock(), report=report.as_dict()
    )
    log.info("retention: %s", report.as_dict())
    return report


def check_interval_s() -> float:
    """How often a process looks whether the run is due (at most every 10 minutes)."""
    return min(max(float(settings.OMNIGENT_RETENTION_INTERVAL_S), 1.0), 600.0)


async def retention_forever() -> None:
    """The process-wide loop (``on_serve``): look whether the run is due, run it if this
    process claims it, until cancelled."""
    from channels.db import database_sync_to_async

    while True:
        await asyncio.sleep(check_interval_s())
        try:
            await database_sync_to_async(run_if_due)()
        except Exception:
            log.exception("retention run failed")


# --- storage figures (the admin) ------------------------------------------------------


def _bytes_of_json(field: str) -> Any:
    return Sum(Length(Cast(field, output_field=TextField())))


def session_storage(*, session_id: str) -> dict[str, int]:
    """Rows and approximate bytes (JSON text) one session holds."""
    items = Item.objects.filter(session_id=session_id).aggregate(
        n=Count("seq"), bytes=_bytes_of_json("data")
    )
    events = SessionEvent.objects.filter(session_id=session_id).aggregate(
        n=Count("id"), bytes=_bytes_of_json("payload")
    )
    files = SessionFile.objects.filter(session_id=session_id).aggregate(
        n=Count("id"), bytes=Sum("bytes")
    )
    return {
        "items": items["n"] or 0,
        "item_bytes": items["bytes"] or 0,
        "events": events["n"] or 0,
        "event_bytes": events["bytes"] or 0,
        "files": files["n"] or 0,
        "file_bytes": files["bytes"] or 0,
    }


def database_bytes() -> int | None:
    """The size of the whole database, as the database reports it."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_database_size(current_database())")
            return int(cursor.fetchone()[0])
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA page_count")
            pages = int(cursor.fetchone()[0])
            cursor.execute("PRAGMA page_size")
            return pages * int(cursor.fetchone()[0])
    return None


def storage_totals() -> dict[str, int | None]:
    """Rows of every session together, and the database's size."""
    from audit.models import AuditRecord

    sessions = Session.objects.aggregate(
        n=Count("id"), archived=Count("id", filter=Q(archived_at__isnull=False))
    )
    return {
        "sessions": sessions["n"] or 0,
        "archived_sessions": sessions["archived"] or 0,
        "items": Item.objects.count(),
        "events": SessionEvent.objects.count(),
        "files": SessionFile.objects.count(),
        "file_bytes": SessionFile.objects.aggregate(n=Sum("bytes"))["n"] or 0,
        "audit_records": AuditRecord.objects.count(),
        "database_bytes": database_bytes(),
    }
