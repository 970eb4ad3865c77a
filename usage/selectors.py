"""Reading usage: a session's totals, and the reports of ``GET /v1/usage`` (docs/usage.md).

Everything here reads the pre-summed rows (``SessionUsage``, ``DailyUsage``), a few per
session or per user and day, never the calls themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from django.db.models import QuerySet, Sum

from .models import DailyUsage, SessionUsage
from .services import SUM_FIELDS
from .shapes import SessionUsageOut, session_usage_body

SUMS = {name: Sum(name) for name in SUM_FIELDS}


def session_usage(*, session_id: str) -> SessionUsageOut | None:
    """The session's ``usage`` (by model); None before its first call."""
    rows = (
        SessionUsage.objects.filter(session_id=session_id)
        .values("model")
        .annotate(**SUMS)
        .order_by("model")
    )
    found = [(row["model"], row) for row in rows]
    return session_usage_body(found) if found else None


def daily_rows(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> QuerySet[DailyUsage]:
    """The per-day rows of these users (all users: None) between two UTC days, inclusive."""
    rows = DailyUsage.objects.all()
    if user_ids is not None:
        rows = rows.filter(user_id__in=list(user_ids))
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    return rows


def session_rows(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> QuerySet[SessionUsage]:
    rows = SessionUsage.objects.all()
    if user_ids is not None:
        rows = rows.filter(user_id__in=list(user_ids))
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    return rows


def grouped(rows: QuerySet[Any], *, by: str) -> list[dict[str, Any]]:
    """Sums of ``rows`` per value of the column ``by``, ordered by it."""
    return list(rows.values(by).annotate(**SUMS).order_by(by))


def cost_per_day(*, user_ids: Sequence[int] | None, since: date, until: date) -> dict[date, int]:
    """Nano-dollars per UTC day (days without cost left out)."""
    rows = daily_rows(user_ids=user_ids, since=since, until=until)
    return {
        row["day"]: int(row["cost"] or 0)
        for row in rows.values("day").annotate(cost=Sum("cost_nano")).order_by("day")
    }


def total_cost(*, user_ids: Sequence[int] | None, since: date | None, until: date | None) -> int:
    found = daily_rows(user_ids=user_ids, since=since, until=until).aggregate(cost=Sum("cost_nano"))
    return int(found["cost"] or 0)


def session_costs(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> dict[str, dict[str, int]]:
    """``{session id: {model: nano-dollars}}`` of the sessions with calls in the range."""
    found: dict[str, dict[str, int]] = {}
    rows = session_rows(user_ids=user_ids, since=since, until=until)
    for row in rows.values("session_id", "model").annotate(cost=Sum("cost_nano")):
        found.setdefault(row["session_id"], {})[row["model"]] = int(row["cost"] or 0)
    return found
