"""Writing the audit log: one ``record`` per act, in the act's own transaction.

Callers (the services of ``sessions`` and ``runners``, the sign-in and token signals)
call ``record`` inside the ``transaction.atomic`` block that performs the act, so the
act and its record commit together or not at all: a record that cannot be written
rolls the act back (lifecycle.md: an act without its record cannot happen).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from .models import AuditPurgePermit, AuditRecord

# The time records are stamped with; tests put a clock of their own here.
clock: Callable[[], datetime] = timezone.now


def actor_name(actor: Any) -> str | None:
    """A user's name, a name as given, or None (the server itself, or nobody signed in)."""
    if actor is None:
        return None
    if isinstance(actor, str):
        return actor or None
    if not getattr(actor, "is_authenticated", False):
        return None
    name = actor.get_username()
    return str(name) if name else None


def arguments_sha256(arguments: Any) -> str:
    """SHA-256 of a tool call's arguments string: the string itself, or an object's
    canonical JSON (sorted keys, no spaces) when only the parsed object is known."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()


def record(
    *,
    actor: Any,
    action: str,
    target_type: str,
    target_id: str,
    session_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditRecord:
    """Append one record. Call it inside the act's ``transaction.atomic`` block."""
    return AuditRecord.objects.create(
        at=clock(),
        actor=actor_name(actor),
        action=action,
        target_type=target_type,
        target_id=str(target_id),
        session_id=session_id,
        details=details or {},
    )


def keep_days() -> int:
    """``OMNIGENT_AUDIT_KEEP_DAYS`` (365); 0 or less keeps records forever."""
    return int(settings.OMNIGENT_AUDIT_KEEP_DAYS)


def purge_cutoff(*, now: datetime) -> datetime | None:
    days = keep_days()
    return now - timedelta(days=days) if days > 0 else None


def purge_older_than(*, cutoff: datetime, dry_run: bool = False) -> int:
    """The retention of audit records: delete those older than ``cutoff``; returns how
    many (would) go. The only deletion the guards let through."""
    old = AuditRecord.objects.filter(at__lt=cutoff)
    if dry_run:
        return old.count()
    with transaction.atomic():
        permit = AuditPurgePermit.objects.create(cutoff=cutoff)
        # ``_raw_delete``: one DELETE, past the queryset's guard; the trigger checks the
        # permit on PostgreSQL.
        deleted = old._raw_delete(connection.alias)
        permit.delete()
    return int(deleted or 0)
