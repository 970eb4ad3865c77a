"""Budgets of sessions and users (usage.md, Budgets): what the runner is told, who may
send a message, and the changes (``PATCH budget_usd``, a schedule's run, an accepted
budget question), each audited as ``budget.change`` in its own transaction.

The runner enforces budgets before every LLM call with the numbers it gets here
(``budgets_for``, sent in ``session.open``, ``turn.start`` and ``policy.update``). The
server refuses a message up front when the session's budget is spent and its policy is
``deny`` (409), or when the session's owner is over their daily budget (429). Spend is
read from the pre-summed totals (``Session.total_cost_nano``, ``usage.DailyUsage``).
Sending to a runner is the caller's part (``runners.budget_updates``).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner import protocol
from omnigent_runner.policies import NO_GUARDRAILS, Guardrails, nano_as_usd, usd_as_nano
from omnigent_site.domain_errors import BudgetExceeded, DailyBudgetExceeded, Forbidden
from omnigent_site.users import is_admin
from usage import selectors as usage_selectors
from usage import services as usage_services

from . import updates, webhook_events
from .approval_shapes import budget_params
from .blobs import BundleMissing
from .models import Approval, Session

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)


# ``Session.owner_daily_nano`` absent: the session was read without it.
_UNREAD = object()

# Bundles this server could not read, and when: tried again after a while.
MISSING_BUNDLE_RETRY_S = 10.0
_missing_bundles: dict[str, float] = {}


def guardrails_of(session: Session) -> Guardrails:
    """The session's bundle guardrails; none when this server cannot see the bundle
    (the runner, which has it, still applies the bundle's own budget)."""
    # Imported here: ``policies`` imports ``approvals``, which imports this module.
    from .policies import bundle_guardrails

    sha = session.agent.bundle_sha256
    missed = _missing_bundles.get(sha)
    if missed is not None and time.monotonic() - missed < MISSING_BUNDLE_RETRY_S:
        return NO_GUARDRAILS
    try:
        return bundle_guardrails(agent=session.agent)
    except BundleMissing:
        # Not read again for a while: this is asked after every run of recorded calls.
        if len(_missing_bundles) > 1024:
            _missing_bundles.clear()
        _missing_bundles[sha] = time.monotonic()
        return NO_GUARDRAILS


def session_limit_nano(session: Session, guardrails: Guardrails | None = None) -> int | None:
    """The session's budget: its own, else its bundle's; None: none."""
    if session.budget_nano is not None:
        return session.budget_nano
    return (guardrails or guardrails_of(session)).budget_nano


def effective_on_budget(session: Session, guardrails: Guardrails | None = None) -> str:
    """``ask`` or ``deny``: the server's own choice (a schedule's run), else the bundle's."""
    return session.on_budget or (guardrails or guardrails_of(session)).on_budget


def budgets_for(session: Session, *, now: datetime | None = None) -> protocol.Budgets:
    """The session's and its owner's budgets as the runner checks them; a line is None
    when there is no such budget. ``now``: the time the owner's day is taken at."""
    guardrails = guardrails_of(session)
    session_line = None
    limit = session_limit_nano(session, guardrails)
    if limit is not None:
        session_line = protocol.BudgetLine(
            scope="session",
            limit_nano=max(limit, 0),
            spent_nano=max(session.total_cost_nano or 0, 0),
            on_budget=session.on_budget,  # type: ignore[arg-type]
        )
    user_line = None
    day = usage_services.utc_day(now or usage_services.clock())
    # Read with the session when the caller asked for it (``selectors.session_for``).
    read: Any = getattr(session, "owner_daily_nano", _UNREAD)
    own = None if read is _UNREAD else (read,)
    user = usage_selectors.user_budget(user_id=session.created_by_id, day=day, own=own)
    if user is not None:
        user_line = protocol.BudgetLine(
            scope="user", limit_nano=max(user[0], 0), spent_nano=max(user[1], 0)
        )
    return protocol.Budgets(session=session_line, user=user_line)


def has_budget(session: Session) -> bool:
    """Whether a runner needs budget updates for this session. Asked after every run of
    recorded calls, so it reads nothing for a session without budgets: the bundle's
    guardrails are cached by hash, the users with a budget of their own per process."""
    if session.budget_nano is not None or usage_selectors.default_daily_budget_nano() is not None:
        return True
    owner = session.created_by_id
    if owner is not None and owner in usage_selectors.users_with_own_budget():
        # Confirmed by its row: the process's list may be a few seconds old.
        if usage_selectors.own_daily_budget_nano(user_id=owner) is not None:
            return True
    return guardrails_of(session).budget_nano is not None


def seconds_to_next_utc_midnight(now: datetime) -> int:
    """Whole seconds until the next UTC day starts (at least 1)."""
    day = usage_services.utc_day(now)
    midnight = datetime(day.year, day.month, day.day, tzinfo=now.tzinfo) + timedelta(days=1)
    if now.tzinfo is None:
        midnight = midnight.replace(tzinfo=None)
    return max(1, int((midnight - now).total_seconds() + 0.999))


def check_message(*, session: Session) -> protocol.Budgets:
    """Refuse a message the budgets would stop, before anything is stored: the
    session's budget spent with ``on_budget: deny`` → 409, the owner over the daily
    budget → 429 until the next UTC midnight (a refusal is a ``budget.exceeded``
    webhook event). Returns the budgets, for the turn's ``turn.start``."""
    now = usage_services.clock()
    budgets = budgets_for(session, now=now)
    line = budgets.session
    if (
        line is not None
        and line.spent_nano >= line.limit_nano
        and effective_on_budget(session) == "deny"
    ):
        message = (
            f"the session's budget of ${nano_as_usd(line.limit_nano)} is spent "
            f"(${nano_as_usd(line.spent_nano)}); raise it with PATCH budget_usd"
        )
        _refused(session, line=line, message=message)
        raise BudgetExceeded(message)
    line = budgets.user
    if line is not None and line.spent_nano >= line.limit_nano:
        message = (
            f"the daily budget of ${nano_as_usd(line.limit_nano)} is spent "
            f"(${nano_as_usd(line.spent_nano)} today); it resets at 00:00 UTC"
        )
        _refused(session, line=line, message=message)
        raise DailyBudgetExceeded(message, retry_after=seconds_to_next_utc_midnight(now))
    return budgets


def _refused(session: Session, *, line: protocol.BudgetLine, message: str) -> None:
    with transaction.atomic():
        webhook_events.budget_exceeded(
            session_id=session.id,
            response_id=None,
            scope=line.scope,
            budget_usd=nano_as_usd(line.limit_nano),
            spent_usd=nano_as_usd(line.spent_nano),
            error={"code": BudgetExceeded.code, "message": message},
        )


# --- changes ----------------------------------------------------------------------------


def _usd(nano: int | None) -> float | None:
    return None if nano is None else nano_as_usd(nano)


def set_session_budget(
    *,
    session: Session,
    actor: AuthUser | None,
    budget_nano: int | None,
    on_budget: str | None = None,
    via: str = "api",
) -> Session:
    """Set (or with None remove) the session's own budget, and with ``on_budget`` the
    server's choice at the limit; audited with the old and new values."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        old, old_policy = locked.budget_nano, locked.on_budget
        locked.budget_nano = budget_nano
        fields = ["budget_nano", "updated_at"]
        if on_budget is not None:
            locked.on_budget = on_budget
            fields.append("on_budget")
        locked.save(update_fields=fields)
        details: dict[str, Any] = {
            "scope": "session",
            "via": via,
            "old_budget_usd": _usd(old),
            "new_budget_usd": _usd(budget_nano),
        }
        if on_budget is not None:
            details["old_on_budget"], details["new_on_budget"] = old_policy, on_budget
        audit.record(
            actor=actor,
            action=audit_actions.BUDGET_CHANGE,
            target_type="session",
            target_id=locked.id,
            session_id=locked.id,
            details=details,
        )
        updates.announce_session(session_id=locked.id)
    session.budget_nano, session.on_budget = locked.budget_nano, locked.on_budget
    session.updated_at = locked.updated_at
    return session


def set_user_budget(*, user: AuthUser, actor: AuthUser | None, daily_nano: int | None) -> None:
    """Set (or with None remove) a user's own daily budget; audited."""
    with transaction.atomic():
        old = usage_services.set_daily_budget(user_id=user.pk, daily_nano=daily_nano)
        audit.record(
            actor=actor,
            action=audit_actions.BUDGET_CHANGE,
            target_type="user",
            target_id=user.get_username(),
            details={
                "scope": "user",
                "via": "api",
                "old_daily_usd": _usd(old),
                "new_daily_usd": _usd(daily_nano),
            },
        )


# --- budget questions (approvals with phase "budget") -----------------------------------


def check_may_accept(*, approval: Approval, user: AuthUser | None, action: str) -> None:
    """A user-scope budget question raises the owner's daily budget: staff only (anyone
    who may answer can still decline)."""
    params = budget_params(approval)
    if action != "accept" or params is None or params.get("scope") != "user":
        return
    if user is None or not is_admin(user):
        raise Forbidden("only staff may raise a user's daily budget; decline instead")


def _nano(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    try:
        return usd_as_nano(value)
    except (ValueError, OverflowError):
        return None


def raise_for_accepted(*, approval: Approval, actor: AuthUser | None) -> bool:
    """An accepted budget question raises the budget it was about, in the verdict's
    transaction: a session's to ``budget_usd + increment_usd``, a user's for today by
    ``increment_usd``. Returns whether a budget changed."""
    params = budget_params(approval)
    if params is None or approval.status != Approval.Status.ACCEPTED:
        return False
    budget, increment = _nano(params.get("budget_usd")), _nano(params.get("increment_usd"))
    if budget is None or increment is None:
        log.warning("budget question %s: unusable params %r", approval.id, params)
        return False
    scope = params.get("scope")
    if scope == "session":
        session = Session.objects.get(pk=approval.session_id)
        set_session_budget(
            session=session, actor=actor, budget_nano=budget + increment, via="approval"
        )
        return True
    if scope == "user":
        owner = (
            Session.objects.filter(pk=approval.session_id)
            .values_list("created_by_id", "created_by__username")
            .first()
        )
        if owner is None or not owner[0]:
            return False
        owner_id, owner_name = owner
        usage_services.raise_daily_budget(
            user_id=owner_id, day=usage_selectors.today(), by_nano=increment
        )
        audit.record(
            actor=actor,
            action=audit_actions.BUDGET_CHANGE,
            target_type="user",
            target_id=owner_name,
            session_id=approval.session_id,
            details={
                "scope": "user",
                "via": "approval",
                "elicitation_id": approval.id,
                "old_budget_usd": nano_as_usd(budget),
                "new_budget_usd": nano_as_usd(budget + increment),
            },
        )
        return True
    return False
