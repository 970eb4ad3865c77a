"""Reading the audit log: who may see which records, and the list's filters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from .models import AuditRecord


@dataclass(frozen=True)
class AuditFilters:
    actor: str | None = None
    action: str | None = None
    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def records_visible_to(
    *,
    username: str,
    is_admin: bool,
    managed_session_ids: QuerySet[Any] | None,
    filters: AuditFilters,
) -> QuerySet[AuditRecord]:
    """Staff see every record; others their own acts and acts on the sessions they
    manage (``managed_session_ids``: a query of those session ids). A ``session_id``
    the caller does not manage gives nothing, not even the caller's own acts there."""
    records = AuditRecord.objects.all()
    if not is_admin:
        managed = managed_session_ids if managed_session_ids is not None else []
        if filters.session_id is not None:
            records = records.filter(session_id__in=managed)
        else:
            records = records.filter(Q(actor=username) | Q(session_id__in=managed))
    if filters.actor is not None:
        records = records.filter(actor=filters.actor)
    if filters.action is not None:
        records = records.filter(action=filters.action)
    if filters.session_id is not None:
        records = records.filter(session_id=filters.session_id)
    if filters.since is not None:
        records = records.filter(at__gte=filters.since)
    if filters.until is not None:
        records = records.filter(at__lt=filters.until)
    return records
