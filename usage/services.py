"""Recording usage (docs/usage.md): one ``record_call`` per LLM call, and the price table.

``record_call`` runs inside the transaction that stores the runner's ``usage.recorded``
event (``runners.runner_events``): the call's row and its two totals commit with the
event or not at all, so a resent event (tunnel.md's at-least-once delivery) is counted
exactly once, as the event is. Each total (per session and day, per user and day, per user and month) is one
``INSERT … ON CONFLICT … DO UPDATE``
that adds to the stored row in the database, so concurrent writers (two server
processes recording calls of one user) never lose an increment.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from omnigent_site import metrics
from omnigent_site.rawsql import quoted

from .models import (
    DailyUsage,
    LlmCall,
    MonthlyUsage,
    Price,
    SessionUsage,
    UserBudget,
    UserBudgetRaise,
)
from .pricing import DEFAULT_PRICES_FILE, NANO, PriceCache, Rates, read_price_file

log = logging.getLogger(__name__)

# The time calls are stamped with (and their UTC day); tests put a clock of their own here.
clock: Callable[[], datetime] = timezone.now

TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)
SUM_FIELDS = (*TOKEN_FIELDS, "llm_calls", "priced_calls", "cost_nano")
# Calls stored by one statement at most (13 values each, and 3 total rows per day).
MAX_CALLS_PER_STATEMENT = 50


@dataclass(frozen=True, slots=True)
class CallUsage:
    """One call's counts as the runner reported them (``input_tokens`` without cache)."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    reported: bool = True


def _load_rates() -> dict[str, Rates]:
    return {
        price.model: Rates.per_million(
            input=price.input_per_million,
            output=price.output_per_million,
            cache_read=price.cache_read_per_million,
            cache_write=price.cache_write_per_million,
        )
        for price in Price.objects.all()
    }


prices = PriceCache(_load_rates)


def cost_of(usage: CallUsage) -> int | None:
    """The call's cost in nano-dollars at today's prices; None when unpriced or unreported."""
    if not usage.reported:
        return None
    rates = prices.rates_for(usage.model)
    if rates is None:
        return None
    return rates.cost_nano(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read=usage.cache_read_input_tokens,
        cache_write=usage.cache_creation_input_tokens,
    )


@dataclass(frozen=True, slots=True)
class PricedCall:
    """A call ready to store: its turn, counts, cost (nano-dollars; None: unpriced) and time."""

    response_id: str
    usage: CallUsage
    cost_nano: int | None
    at: datetime


def price_call(*, response_id: str, usage: CallUsage) -> PricedCall:
    """The call priced now (``clock``), for :func:`record_calls`."""
    return PricedCall(response_id, usage, cost_of(usage), clock())


def utc_day(at: datetime) -> date:
    """The UTC day of a time (a naive time is taken as UTC)."""
    return at.astimezone(UTC).date() if timezone.is_aware(at) else at.date()


def record_call(
    *,
    session_id: str,
    response_id: str,
    user_id: int | None,
    agent_name: str,
    usage: CallUsage,
) -> int | None:
    """Store one LLM call, priced now, and add it to the session's and the user's
    totals; returns its cost (nano-dollars, None when unpriced).

    Call it inside the transaction that stores the call's runner event. A call that
    reported nothing counts as a call and adds no tokens and no cost.
    """
    call = price_call(response_id=response_id, usage=usage)
    record_calls(session_id=session_id, user_id=user_id, agent_name=agent_name, calls=[call])
    return call.cost_nano


def record_calls(
    *, session_id: str, user_id: int | None, agent_name: str, calls: Sequence[PricedCall]
) -> None:
    """Store a session's priced calls and add them to the totals, in the open transaction.

    The runner's events of one run come here together (``runners.runner_events``): the
    calls are summed per total row in Python first, so each row gets one ``n = n +
    excluded.n`` however many calls it takes, and on PostgreSQL the whole run is one
    statement (the server's CPU per call is mostly the driver's per-statement work,
    bench/usage.py). Values go to the driver as they are: no model instances.
    """
    if len(calls) > MAX_CALLS_PER_STATEMENT:  # SQLite's and the driver's parameter limits
        for start in range(0, len(calls), MAX_CALLS_PER_STATEMENT):
            chunk = calls[start : start + MAX_CALLS_PER_STATEMENT]
            record_calls(session_id=session_id, user_id=user_id, agent_name=agent_name, calls=chunk)
        return
    if not calls:
        return
    user = user_id or 0
    adapt = connection.ops.adapt_datetimefield_value
    call_rows: list[Any] = []
    by_day: dict[tuple[date, str], list[int]] = {}
    by_month: dict[tuple[date, str], list[int]] = {}
    for call in calls:
        usage, cost, at = call.usage, call.cost_nano, call.at
        tokens = (
            [
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_input_tokens,
                usage.cache_creation_input_tokens,
                usage.reasoning_tokens,
            ]
            if usage.reported
            else [0, 0, 0, 0, 0]
        )
        # The order of ``_CALL_COLUMNS``.
        call_rows += [session_id, call.response_id, user, agent_name, usage.model,
                      usage.reported, cost, adapt(at), *tokens]  # fmt: skip
        day = utc_day(at)
        sums = [*tokens, 1, 0 if cost is None else 1, cost or 0]
        for totals, key in (
            (by_day, (day, usage.model)),
            (by_month, (day.replace(day=1), usage.model)),
        ):
            found = totals.get(key)
            if found is None:
                totals[key] = list(sums)
            else:
                for index, value in enumerate(sums):
                    found[index] += value
    session_rows: list[list[Any]] = [
        [session_id, d, m, user, agent_name, *n] for (d, m), n in by_day.items()
    ]
    daily_rows: list[list[Any]] = [[user, d, m, agent_name, *n] for (d, m), n in by_day.items()]
    monthly_rows: list[list[Any]] = [[user, d, m, agent_name, *n] for (d, m), n in by_month.items()]
    # omnigent_llm_tokens_total / omnigent_llm_cost_usd_total, once the calls are stored.
    counted = [(model, n[0], n[1], n[7]) for (_month, model), n in by_month.items()]
    transaction.on_commit(lambda: _count_calls(counted))
    shape = (len(calls), len(by_day), len(by_month))
    params: list[Any] = [
        value for rows in (session_rows, daily_rows, monthly_rows) for row in rows for value in row
    ]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_combined_sql(*shape), [*params, *call_rows])
            return
        cursor.execute(_insert_calls_sql(len(calls)), call_rows)
        for sql, rows in zip(
            _upserts(len(by_day), len(by_month)),
            (session_rows, daily_rows, monthly_rows),
            strict=True,
        ):
            cursor.execute(sql, [value for row in rows for value in row])


def _count_calls(counted: list[tuple[str, int, int, int]]) -> None:
    for model, input_tokens, output_tokens, cost_nano in counted:
        metrics.llm_usage(
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=cost_nano / NANO,
        )


# The stored columns of ``LlmCall`` (its id is generated), in the order ``record_calls``
# gives their values.
_CALL_COLUMNS = (
    "session_id", "response_id", "user_id", "agent_name", "model", "reported", "cost_nano",
    "created_at", *TOKEN_FIELDS,
)  # fmt: skip


@functools.cache
def _upserts(days: int, months: int) -> tuple[str, str, str]:
    return (
        _upsert_sql(SessionUsage, ("session_id", "day", "model"), ("user_id", "agent_name"), days),
        _upsert_sql(DailyUsage, ("user_id", "day", "model", "agent_name"), (), days),
        _upsert_sql(MonthlyUsage, ("user_id", "month", "model", "agent_name"), (), months),
    )


def _values(columns: int, rows: int) -> str:
    one = "(" + ", ".join(["%s"] * columns) + ")"
    return ", ".join([one] * rows)


@functools.cache
def _insert_calls_sql(rows: int) -> str:
    columns = ", ".join(quoted(LlmCall, name) for name in _CALL_COLUMNS)
    return f"INSERT INTO {quoted(LlmCall)} ({columns}) VALUES {_values(len(_CALL_COLUMNS), rows)}"


@functools.cache
def _combined_sql(calls: int, days: int, months: int) -> str:
    """PostgreSQL: the three upserts as data-modifying CTEs of the calls' INSERT."""
    upserts = ", ".join(f"t{n} AS ({sql})" for n, sql in enumerate(_upserts(days, months)))
    return f"WITH {upserts} {_insert_calls_sql(calls)}"


@functools.cache
def _upsert_sql(
    model: type[Model], keys: Sequence[str], others: Sequence[str], rows: int = 1
) -> str:
    """One statement that adds to ``rows`` total rows (distinct keys), creating those
    missing; the addition happens in the database (``stored + new``), under its row lock."""
    table = quoted(model)
    columns = [*keys, *others, *SUM_FIELDS]
    names = ", ".join(quoted(model, name) for name in columns)
    conflict = ", ".join(quoted(model, name) for name in keys)
    sets = ", ".join(
        f"{quoted(model, name)} = {table}.{quoted(model, name)} + excluded.{quoted(model, name)}"
        for name in SUM_FIELDS
    )
    return (
        f"INSERT INTO {table} ({names}) VALUES {_values(len(columns), rows)} "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {sets}"
    )


# --- the price table ---------------------------------------------------------------------


def price_file() -> Path:
    """``OMNIGENT_PRICES``, else the shipped table."""
    configured = str(getattr(settings, "OMNIGENT_PRICES", "") or "").strip()
    return Path(configured) if configured else DEFAULT_PRICES_FILE


def sync_prices(*, path: Path | None = None, overwrite: bool = True) -> tuple[int, int]:
    """Load the YAML price table into the database: ``(created, updated)``. Models the
    file does not list are kept (the admin's additions); ``overwrite=False`` also keeps
    the rows already stored (the admin's edits). Raises ``PriceFileError``."""
    table = read_price_file(path or price_file())
    created = updated = 0
    with transaction.atomic():
        stored = {price.model: price for price in Price.objects.select_for_update()}
        for model, rates in table.items():
            price = stored.get(model)
            if price is None:
                Price.objects.create(model=model, **rates)
                created += 1
                continue
            if not overwrite:
                continue
            changed = [name for name, value in rates.items() if getattr(price, name) != value]
            if changed:
                for name in changed:
                    setattr(price, name, rates[name])
                price.save(update_fields=[*changed, "updated_at"])
                updated += 1
    transaction.on_commit(prices.clear)
    return created, updated


def load_missing_prices_after_migrate(**_kwargs: Any) -> None:
    """``post_migrate``: add the file's models the table lacks; a broken file is logged
    (the server still starts, its calls unpriced) rather than failing the migration."""
    try:
        created, _updated = sync_prices(overwrite=False)
    except ValueError as exc:
        log.error("the price table was not loaded: %s", exc)
        return
    if created:
        log.info("loaded %d prices from %s", created, price_file())


# --- budgets (usage.md, Budgets) ---------------------------------------------------------


def set_daily_budget(*, user_id: int, daily_nano: int | None) -> int | None:
    """Store the user's own daily budget (None removes it: the server default applies);
    returns the previous one. Call it inside the change's audited transaction."""
    # This process's list of users with a budget is read again (now and after the commit).
    from .selectors import forget_budgeted_users

    forget_budgeted_users()
    transaction.on_commit(forget_budgeted_users)
    row = UserBudget.objects.select_for_update().filter(user_id=user_id).first()
    old = row.daily_nano if row is not None else None
    if daily_nano is None:
        if row is not None:
            row.delete()
    elif row is None:
        UserBudget.objects.create(user_id=user_id, daily_nano=daily_nano)
    else:
        row.daily_nano = daily_nano
        row.save(update_fields=["daily_nano", "updated_at"])
    return old


def raise_daily_budget(*, user_id: int, day: date, by_nano: int) -> None:
    """Add ``by_nano`` to the user's budget for ``day`` only (an accepted budget
    question): one upsert that adds in the database, so two raises both count."""
    sql = (
        f"INSERT INTO {quoted(UserBudgetRaise)} "
        f"({quoted(UserBudgetRaise, 'user_id')}, {quoted(UserBudgetRaise, 'day')}, "
        f"{quoted(UserBudgetRaise, 'raised_nano')}) VALUES (%s, %s, %s) "
        f"ON CONFLICT ({quoted(UserBudgetRaise, 'user_id')}, {quoted(UserBudgetRaise, 'day')}) "
        f"DO UPDATE SET {quoted(UserBudgetRaise, 'raised_nano')} = "
        f"{quoted(UserBudgetRaise)}.{quoted(UserBudgetRaise, 'raised_nano')} + "
        f"excluded.{quoted(UserBudgetRaise, 'raised_nano')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [user_id, day, by_nano])
