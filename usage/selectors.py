"""Reading usage: a session's totals, and the reports of ``GET /v1/usage`` (docs/usage.md).

Everything here reads the pre-summed rows, never the calls: ``SessionUsage`` (session,
day, model), ``DailyUsage`` and ``MonthlyUsage`` (user, day or month, model, agent). A
range is read as its whole calendar months from the monthly rows and only the days at
its two edges from the daily ones, so a year is at most 12 months and 60 days of rows
per user, model and agent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet, Sum

from omnigent_runner.policies import usd_as_nano

from . import services
from .models import DailyUsage, MonthlyUsage, SessionUsage, UserBudget, UserBudgetRaise
from .services import SUM_FIELDS
from .shapes import SessionUsageOut, session_usage_body

SUMS = {name: Sum(name) for name in SUM_FIELDS}
# The columns of ``grouped`` rows after their key.
GROUPED_FIELDS = SUM_FIELDS


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


def _next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


def split_range(
    since: date | None, until: date | None
) -> tuple[list[tuple[date | None, date | None]], tuple[date | None, date | None] | None]:
    """``(day ranges, month range)`` that together cover ``[since, until]`` (inclusive,
    None: open) once: the whole months in it, and the days before and after them."""
    first_month = since if since is None or since.day == 1 else _next_month(since)
    if until is None:
        end = None  # months up to the last one
    elif _next_month(until) - timedelta(days=1) == until:
        end = until.replace(day=1)
    else:
        end = until.replace(day=1) - timedelta(days=1)
        end = end.replace(day=1)
    if first_month is not None and end is not None and first_month > end:
        return [(since, until)], None
    days: list[tuple[date | None, date | None]] = []
    if since is not None and first_month is not None and since < first_month:
        days.append((since, first_month - timedelta(days=1)))
    if until is not None and end is not None and until >= _next_month(end):
        days.append((_next_month(end), until))
    return days, (first_month, end)


def _users(rows: QuerySet[Any], user_ids: Sequence[int] | None) -> QuerySet[Any]:
    return rows if user_ids is None else rows.filter(user_id__in=list(user_ids))


def daily_rows(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> QuerySet[DailyUsage]:
    """The per-day rows of these users (all users: None) between two UTC days, inclusive."""
    rows = _users(DailyUsage.objects.all(), user_ids)
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    return rows


def _ranged(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> list[QuerySet[Any]]:
    """The monthly and daily rows that cover the range once."""
    days, months = split_range(since, until)
    parts: list[QuerySet[Any]] = []
    if months is not None:
        rows = _users(MonthlyUsage.objects.all(), user_ids)
        if months[0] is not None:
            rows = rows.filter(month__gte=months[0])
        if months[1] is not None:
            rows = rows.filter(month__lte=months[1])
        parts.append(rows)
    if days:
        where = Q()
        for first, last in days:
            where |= Q(day__gte=first, day__lte=last)
        parts.append(_users(DailyUsage.objects.all(), user_ids).filter(where))
    return parts


def session_rows(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> QuerySet[SessionUsage]:
    rows = _users(SessionUsage.objects.all(), user_ids)
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    return rows


def _summed(parts: Iterable[QuerySet[Any]], by: str) -> list[tuple[Any, ...]]:
    """``(key, *SUM_FIELDS)`` per value of ``by`` over every part, ordered by key."""
    totals: dict[Any, list[int]] = {}
    for rows in parts:
        for key, *sums in rows.values(by).annotate(**SUMS).values_list(by, *SUM_FIELDS):
            found = totals.setdefault(key, [0] * len(SUM_FIELDS))
            for index, value in enumerate(sums):
                found[index] += int(value or 0)
    return [(key, *totals[key]) for key in sorted(totals)]


def grouped(
    group: str, *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> list[tuple[Any, ...]]:
    """``(key, *SUM_FIELDS)`` per day, model, agent, session or user in the range."""
    if group == "session":
        return _summed([session_rows(user_ids=user_ids, since=since, until=until)], "session_id")
    if group == "day":
        return _summed([daily_rows(user_ids=user_ids, since=since, until=until)], "day")
    column = {"model": "model", "agent": "agent_name", "user": "user_id"}[group]
    return _summed(_ranged(user_ids=user_ids, since=since, until=until), column)


def cost_per_day(*, user_ids: Sequence[int] | None, since: date, until: date) -> dict[date, int]:
    """Nano-dollars per UTC day (days without cost left out)."""
    rows = daily_rows(user_ids=user_ids, since=since, until=until)
    return {
        day: int(cost or 0)
        for day, cost in rows.values("day")
        .annotate(cost=Sum("cost_nano"))
        .values_list("day", "cost")
    }


def total_cost(*, user_ids: Sequence[int] | None, since: date | None, until: date | None) -> int:
    total = 0
    for rows in _ranged(user_ids=user_ids, since=since, until=until):
        total += int(rows.aggregate(cost=Sum("cost_nano"))["cost"] or 0)
    return total


def session_costs(
    *, user_ids: Sequence[int] | None, since: date | None, until: date | None
) -> dict[str, dict[str, int]]:
    """``{session id: {model: nano-dollars}}`` of the sessions with calls in the range."""
    found: dict[str, dict[str, int]] = {}
    rows = session_rows(user_ids=user_ids, since=since, until=until)
    for session_id, model, cost in (
        rows.values("session_id", "model")
        .annotate(cost=Sum("cost_nano"))
        .values_list("session_id", "model", "cost")
    ):
        found.setdefault(session_id, {})[model] = int(cost or 0)
    return found


# --- budgets (usage.md, Budgets) ---------------------------------------------------------


def today() -> date:
    """The UTC day spend is counted in now (the recording clock, which tests set)."""
    return services.utc_day(services.clock())


def default_daily_budget_nano() -> int | None:
    """``OMNIGENT_DAILY_BUDGET_USD`` as nano-dollars; None when unset."""
    usd = getattr(settings, "OMNIGENT_DAILY_BUDGET_USD", None)
    return None if usd is None else usd_as_nano(usd)


# Users with a budget of their own, as this process last read them: the hot path after
# each recorded call asks only "might this owner have one?" (``sessions.budgets``).
BUDGETED_USERS_TTL_S = 10.0
_budgeted_users: tuple[float, frozenset[int]] | None = None


def users_with_own_budget() -> frozenset[int]:
    """The ids of users with a daily budget of their own: one read per
    ``BUDGETED_USERS_TTL_S`` per process (a change in this process is seen at once,
    ``services.set_daily_budget``; one made in another within that time)."""
    global _budgeted_users
    now = time.monotonic()
    if _budgeted_users is None or now - _budgeted_users[0] > BUDGETED_USERS_TTL_S:
        ids = UserBudget.objects.filter(daily_nano__isnull=False).values_list("user_id", flat=True)
        _budgeted_users = (now, frozenset(ids))
    return _budgeted_users[1]


def forget_budgeted_users() -> None:
    global _budgeted_users
    _budgeted_users = None


def own_daily_budget_nano(*, user_id: int) -> int | None:
    """The user's own daily budget (staff set it); None: none of their own."""
    row = UserBudget.objects.filter(user_id=user_id).values_list("daily_nano", flat=True).first()
    return row


def daily_budget_nano(*, user_id: int, own: tuple[int | None] | None = None) -> int | None:
    """The user's daily budget: their own, else the server default; None: no budget.
    ``own``: their own budget as the caller read it (a 1-tuple), else it is read here."""
    mine = own[0] if own is not None else own_daily_budget_nano(user_id=user_id)
    return mine if mine is not None else default_daily_budget_nano()


def raised_nano(*, user_id: int, day: date) -> int:
    """What accepted budget questions added to the user's budget on ``day``."""
    raised = (
        UserBudgetRaise.objects.filter(user_id=user_id, day=day)
        .values_list("raised_nano", flat=True)
        .first()
    )
    return raised or 0


def spent_nano(*, user_id: int, day: date) -> int:
    """The user's priced spend on ``day``: the day's few pre-summed rows (one per model
    and agent), never the calls."""
    total = DailyUsage.objects.filter(user_id=user_id, day=day).aggregate(cost=Sum("cost_nano"))[
        "cost"
    ]
    return int(total or 0)


def user_budget(
    *, user_id: int | None, day: date, own: tuple[int | None] | None = None
) -> tuple[int, int] | None:
    """``(limit, spent)`` of the user's budget for ``day`` (limit with the day's
    raises); None when the user has no daily budget, then without reading the day's
    rows. ``own``: see ``daily_budget_nano``."""
    if not user_id:
        return None
    limit = daily_budget_nano(user_id=user_id, own=own)
    if limit is None:
        return None
    return limit + raised_nano(user_id=user_id, day=day), spent_nano(user_id=user_id, day=day)
