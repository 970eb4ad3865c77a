"""Writes of scheduled tasks and their runs (automation.md, Schedules).

Keyword-only functions that raise ``omnigent_site.domain_errors``. ``now`` is always a
parameter: the firing loop passes its clock (``schedules.clock``), so tests move time
instead of waiting for it.

Exactly once per occurrence: :func:`claim_due` inserts the occurrence's run row (unique
``(task, scheduled_for)``) and moves the task's ``next_run_at`` past it in one
transaction. On PostgreSQL the task row is read ``FOR UPDATE SKIP LOCKED``, so a second
process skips a task another is claiming instead of waiting for it; on SQLite writes
are serialised (``IMMEDIATE`` transactions). Either way the unique row is the backstop:
a second insert of the same occurrence fails and fires nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Min

from omnigent_runner.policies import NANO_PER_USD
from omnigent_site.domain_errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
)
from runners import dispatch
from runners import services as runner_services
from runners.models import Runner
from sessions import budgets
from sessions import selectors as session_selectors
from sessions import services as session_services
from sessions.models import Permission, Session, Turn
from webhook_outbox.events import enqueue_webhook_event

from . import rules
from .models import ScheduledRun, ScheduledTask

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

UNSET: Any = object()
EDIT = Permission.Level.EDIT
PREVIEW_COUNT = 5
# A claimed run that never got its message to a runner (its process died while firing)
# is failed after this long.
STALLED_AFTER = timedelta(minutes=2)
MISSED = "missed: the server was not running at the scheduled time"
STILL_RUNNING = "the previous run is still running"


# --- webhook events (automation.md: schedule.run_started, schedule.run_finished) ----------


def _announce(run: ScheduledRun, *, owner_id: int) -> None:
    """The run's webhook event, in the transaction that writes its state: started while
    ``running``, finished otherwise. The task's owner's webhooks receive it."""
    kind = (
        "schedule.run_started"
        if run.status == ScheduledRun.Status.RUNNING
        else ("schedule.run_finished")
    )
    enqueue_webhook_event(
        type=kind,
        owner_id=owner_id,
        data={
            "session_id": run.session_id or None,
            "run": {
                "id": run.id,
                "task_id": run.task_id,
                "session_id": run.session_id or None,
                "response_id": run.response_id or None,
                "status": run.status,
                "scheduled_for": run.scheduled_for.isoformat(),
                "error": run.error or None,
            },
        },
    )


def _finish(run_id: str, *, status: str, error: str, finished: datetime) -> int:
    """A ``running`` run ends (once), with its webhook event."""
    with transaction.atomic():
        changed = ScheduledRun.objects.filter(pk=run_id, status=ScheduledRun.Status.RUNNING).update(
            status=status, error=error[:2000], finished_at=finished
        )
        if changed:
            run = ScheduledRun.objects.select_related("task").get(pk=run_id)
            _announce(run, owner_id=run.task.owner_id)
    return changed


# --- validation -------------------------------------------------------------------------


def rule_of(task: ScheduledTask) -> rules.Rule:
    return rules.restore(
        body=task.rule_body,
        zone=task.timezone,
        dtstart=task.dtstart_local,
        anchor=task.anchor_local,
    )


def preview(*, rrule: object, timezone: object, now: datetime) -> list[datetime]:
    """The next five occurrences of a rule, as creating a task now would fire them."""
    zone = rules.zone_named(timezone)
    rule = rules.parse(text=rrule, zone=zone, now=now)
    return rule.upcoming(now, PREVIEW_COUNT)


def _check_agent(*, owner: AuthUser, agent_id: str) -> None:
    try:
        session_selectors.agent_for(agent_id=agent_id, user=owner)
    except NotFound as exc:
        raise InvalidInput(f"agent {agent_id!r} not found", field="agent_id") from exc


def _check_runner(*, owner: AuthUser, runner_id: str) -> None:
    if not runner_id:
        return
    runner = Runner.objects.filter(pk=runner_id, revoked_at__isnull=True).first()
    if runner is None or runner.owner_id != owner.pk:
        raise InvalidInput(f"runner {runner_id!r} not found", field="runner_id")


def _check_session(*, owner: AuthUser, mode: str, session_id: str) -> None:
    if mode == ScheduledTask.Mode.NEW:
        if session_id:
            raise InvalidInput("only session_mode 'continue' takes a session", field="session_id")
        return
    if not session_id:
        raise InvalidInput("session_mode 'continue' needs a session_id", field="session_id")
    try:
        session_selectors.session_for(session_id=session_id, user=owner, level=EDIT)
    except (NotFound, Forbidden) as exc:
        raise InvalidInput(
            f"session {session_id!r} not found or not editable by you", field="session_id"
        ) from exc


def _cost(value: Any) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise InvalidInput("must be a number of US dollars or null", field="max_cost_usd")
    amount = Decimal(str(value))
    if not amount.is_finite() or amount <= 0 or amount >= Decimal("1e8"):
        raise InvalidInput("must be more than 0", field="max_cost_usd")
    return amount.quantize(Decimal("0.0001"))


def _schedule(task: ScheduledTask, rule: rules.Rule, *, now: datetime) -> None:
    """Store the parsed rule and the next occurrence after ``now`` (none while disabled)."""
    task.rule_body = rule.body
    task.dtstart_local = rules.local_text(rule.dtstart)
    task.anchor_local = rules.local_text(rule.anchor)
    task.next_run_at = rule.next_after(now) if task.enabled else None


# --- tasks -----------------------------------------------------------------------------


def create_task(
    *,
    owner: AuthUser,
    name: str,
    agent_id: str,
    prompt: str,
    rrule: str,
    timezone: str,
    now: datetime,
    runner_id: str | None = None,
    enabled: bool = True,
    max_cost_usd: Any = None,
    session_mode: str = ScheduledTask.Mode.NEW,
    session_id: str | None = None,
) -> ScheduledTask:
    zone = rules.zone_named(timezone)
    rule = rules.parse(text=rrule, zone=zone, now=now)
    if not name.strip():
        raise InvalidInput("must not be blank", field="name")
    if not prompt.strip():
        raise InvalidInput("must not be blank", field="prompt")
    _check_agent(owner=owner, agent_id=agent_id)
    _check_runner(owner=owner, runner_id=runner_id or "")
    _check_session(owner=owner, mode=session_mode, session_id=session_id or "")
    task = ScheduledTask(
        owner=owner,
        name=name.strip(),
        agent_id=agent_id,
        prompt=prompt,
        rrule=rrule.strip(),
        timezone=timezone,
        runner_id=runner_id or "",
        enabled=enabled,
        max_cost_usd=_cost(max_cost_usd),
        session_mode=session_mode,
        session_id=session_id or "",
    )
    _schedule(task, rule, now=now)
    task.save(force_insert=True)
    return task


def update_task(
    *,
    task: ScheduledTask,
    now: datetime,
    name: Any = UNSET,
    agent_id: Any = UNSET,
    prompt: Any = UNSET,
    rrule: Any = UNSET,
    timezone: Any = UNSET,
    runner_id: Any = UNSET,
    enabled: Any = UNSET,
    max_cost_usd: Any = UNSET,
    session_mode: Any = UNSET,
    session_id: Any = UNSET,
) -> ScheduledTask:
    """Change a task; a new rule, zone or enabling schedules from ``now`` (no catch-up)."""
    owner = task.owner
    if name is not UNSET:
        if not name.strip():
            raise InvalidInput("must not be blank", field="name")
        task.name = name.strip()
    if prompt is not UNSET:
        if not prompt.strip():
            raise InvalidInput("must not be blank", field="prompt")
        task.prompt = prompt
    if agent_id is not UNSET:
        _check_agent(owner=owner, agent_id=agent_id)
        task.agent_id = agent_id
    if runner_id is not UNSET:
        _check_runner(owner=owner, runner_id=runner_id or "")
        task.runner_id = runner_id or ""
    if max_cost_usd is not UNSET:
        task.max_cost_usd = _cost(max_cost_usd)
    if session_mode is not UNSET or session_id is not UNSET:
        mode = task.session_mode if session_mode is UNSET else session_mode
        target = task.session_id if session_id is UNSET else (session_id or "")
        if mode == ScheduledTask.Mode.NEW and session_id is UNSET:
            target = ""
        _check_session(owner=owner, mode=mode, session_id=target)
        task.session_mode, task.session_id = mode, target
    reschedule = rrule is not UNSET or timezone is not UNSET or enabled is not UNSET
    if reschedule:
        if enabled is not UNSET:
            task.enabled = enabled
        if rrule is not UNSET or timezone is not UNSET:
            zone = rules.zone_named(task.timezone if timezone is UNSET else timezone)
            text = task.rrule if rrule is UNSET else rrule
            rule = rules.parse(text=text, zone=zone, now=now)
            task.rrule = text.strip()
            task.timezone = zone.key
        else:
            rule = rule_of(task)
        _schedule(task, rule, now=now)
    task.save()
    return task


def delete_task(*, task: ScheduledTask) -> None:
    """The task and its run history; sessions its runs started stay."""
    task.delete()


# --- claiming occurrences ----------------------------------------------------------------


def seconds_until_due(*, now: datetime, cap: float) -> float:
    """How long the firing loop may sleep: until the earliest due task, at most ``cap``."""
    earliest = ScheduledTask.objects.filter(enabled=True, next_run_at__isnull=False).aggregate(
        at=Min("next_run_at")
    )["at"]
    if earliest is None:
        return cap
    return max(0.0, min(cap, (earliest - now).total_seconds()))


def claim_due(*, now: datetime, grace_s: float, process_id: str, limit: int = 100) -> list[str]:
    """Claim every occurrence due at ``now``; return the ids of the runs to fire.

    Per task, in one transaction: the latest occurrence not after ``now`` (one catch-up
    at most, however many were missed) gets its run row, ``running`` to be fired by the
    caller, or ``skipped`` when it is more than ``grace_s`` late ("missed") or the
    task's previous run is still running; ``next_run_at`` moves to the first
    occurrence after ``now``.
    """
    claimed = []
    for task_id in due_task_ids(now=now, limit=limit):
        run_id = claim_task(task_id=task_id, now=now, grace_s=grace_s, process_id=process_id)
        if run_id is not None:
            claimed.append(run_id)
    return claimed


def due_task_ids(*, now: datetime, limit: int = 100) -> list[str]:
    """The tasks due at ``now``, earliest first (no lock: :func:`claim_task` decides)."""
    return list(
        ScheduledTask.objects.filter(enabled=True, next_run_at__lte=now)
        .order_by("next_run_at")
        .values_list("id", flat=True)[:limit]
    )


def claim_task(*, task_id: str, now: datetime, grace_s: float, process_id: str) -> str | None:
    """Claim the task's due occurrence (:func:`claim_due`); the run id to fire, or None
    (claimed by another process, or recorded ``skipped``)."""
    grace = timedelta(seconds=grace_s)
    with transaction.atomic():
        found = ScheduledTask.objects.filter(pk=task_id, enabled=True, next_run_at__lte=now)
        if connection.features.has_select_for_update_skip_locked:
            found = found.select_for_update(skip_locked=True)
        task = found.first()
        if task is None or task.next_run_at is None:
            return None  # claimed by another process meanwhile
        rule = rule_of(task)
        first_due = task.next_run_at
        occurrence = rule.latest_until(now, after=first_due - timedelta(microseconds=1))
        occurrence = occurrence or first_due
        status, error = ScheduledRun.Status.RUNNING, ""
        if now - occurrence > grace:
            status, error = ScheduledRun.Status.SKIPPED, MISSED
        elif task.runs.filter(status=ScheduledRun.Status.RUNNING).exists():
            status, error = ScheduledRun.Status.SKIPPED, STILL_RUNNING
        run = ScheduledRun(
            task=task,
            scheduled_for=occurrence,
            trigger=ScheduledRun.Trigger.SCHEDULE,
            status=status,
            error=error,
            finished_at=now if status == ScheduledRun.Status.SKIPPED else None,
            budget_usd=task.max_cost_usd,
            claimed_by=process_id,
        )
        inserted = True
        try:
            with transaction.atomic():
                run.save(force_insert=True)
        except IntegrityError:
            inserted = False  # this occurrence already has its run
        if inserted and status == ScheduledRun.Status.SKIPPED:
            _announce(run, owner_id=task.owner_id)
        rule = rule.rebased(occurrence)
        task.anchor_local = rules.local_text(rule.anchor)
        task.next_run_at = rule.next_after(max(now, occurrence))
        task.save(update_fields=["anchor_local", "next_run_at", "updated_at"])
    return run.id if inserted and status == ScheduledRun.Status.RUNNING else None


def claim_manual_run(*, task: ScheduledTask, now: datetime, process_id: str) -> ScheduledRun:
    """``POST …/run``: a run now, whatever the rule; 409 while one is in flight."""
    with transaction.atomic():
        locked = ScheduledTask.objects.select_for_update().filter(pk=task.pk).first()
        if locked is None:
            raise NotFound(f"scheduled task {task.pk!r} not found")
        if locked.runs.filter(status=ScheduledRun.Status.RUNNING).exists():
            raise Conflict("a run of this task is in flight")
        return ScheduledRun.objects.create(
            task=locked,
            scheduled_for=now,
            trigger=ScheduledRun.Trigger.MANUAL,
            budget_usd=locked.max_cost_usd,
            claimed_by=process_id,
        )


# --- firing --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fire:
    """A run whose message is stored: what ``dispatch.deliver_message`` hands on."""

    run_id: str
    session: Session
    accepted: dispatch.AcceptedMessage


def _skip(run: ScheduledRun, reason: str, *, now: datetime) -> None:
    run.status = ScheduledRun.Status.SKIPPED
    run.error = reason
    run.finished_at = now
    with transaction.atomic():
        run.save(update_fields=["status", "error", "finished_at", "session_id"])
        _announce(run, owner_id=run.task.owner_id)


def _runner_for(task: ScheduledTask) -> Runner | str:
    """The runner a new session is bound to, or why there is none."""
    if task.runner_id:
        runner = Runner.objects.filter(
            pk=task.runner_id, owner=task.owner, revoked_at__isnull=True
        ).first()
        if runner is None:
            return f"runner {task.runner_id!r} is no longer registered"
        return runner if runner.online else f"runner {task.runner_id!r} is offline"
    candidates = Runner.objects.filter(
        owner=task.owner, revoked_at__isnull=True, last_seen_at__isnull=False
    ).exclude(channel_name="")
    for runner in candidates.order_by("-last_seen_at")[:20]:
        if runner.online:
            return runner
    return "no runner of the owner is online"


def _session_for(run: ScheduledRun, *, now: datetime) -> Session | str:
    """The session the run posts to (a new one, bound to a runner), or why not."""
    task = run.task
    owner = task.owner
    if task.session_mode == ScheduledTask.Mode.CONTINUE:
        try:
            session, _ = session_selectors.session_for(
                session_id=task.session_id, user=owner, level=EDIT
            )
        except (NotFound, Forbidden):
            return f"session {task.session_id!r} is gone or no longer editable by the owner"
        if session.runner is None:
            return "the session has no runner"
        if not session.runner.online:
            return f"the session's runner {session.runner_id!r} is offline"
        if run.budget_usd is not None:
            _set_run_budget(run, session, spent_nano=session.total_cost_nano or 0)
        return session
    try:
        agent = session_selectors.agent_for(agent_id=task.agent_id, user=owner)
    except NotFound:
        return f"agent {task.agent_id!r} no longer exists"
    runner = _runner_for(task)
    if isinstance(runner, str):
        return runner
    local = run.scheduled_for.astimezone(rules.zone_named(task.timezone))
    session = session_services.create_session(
        user=owner, agent=agent, title=f"{task.name} · {local:%Y-%m-%d %H:%M}"
    )
    run.session_id = session.id
    if run.budget_usd is not None:
        # Before the session opens on the runner, so ``session.open`` carries it.
        _set_run_budget(run, session, spent_nano=0)
    return runner_services.bind_session_runner(session=session, actor=owner, runner_id=runner.id)


def _set_run_budget(run: ScheduledRun, session: Session, *, spent_nano: int) -> None:
    """The run's ``max_cost_usd`` as the session's budget with ``on_budget: deny``
    (automation.md): a new session's budget is the amount, a continued one's what it
    spent so far plus the amount."""
    amount = Decimal(run.budget_usd or 0) * NANO_PER_USD
    limit = spent_nano + int(amount.to_integral_value(ROUND_HALF_UP))
    budgets.set_session_budget(
        session=session, actor=run.task.owner, budget_nano=limit, on_budget="deny", via="schedule"
    )


def prepare_fire(*, run_id: str, now: datetime) -> Fire | None:
    """The sync part of a fire: the session (created and bound, or the task's) and the
    prompt stored as its message; None when the run is skipped (recorded with why)."""
    run = ScheduledRun.objects.select_related("task__owner").get(pk=run_id)
    task = run.task
    if not task.owner.is_active:
        _skip(run, "the owner's account is disabled", now=now)
        return None
    try:
        session = _session_for(run, now=now)
    except DomainError as exc:
        _skip(run, exc.message, now=now)
        return None
    if isinstance(session, str):
        _skip(run, session, now=now)
        return None
    data = session_services.normalise_message(
        {"role": "user", "content": task.prompt}, field="prompt"
    )
    try:
        accepted = dispatch.accept_message(
            session=session,
            created_by=task.owner.get_username(),
            data=data,
            tools=[],
            user_id=task.owner_id,
        )
    except DomainError as exc:
        run.session_id = session.id
        _skip(run, exc.message, now=now)
        return None
    run.session_id = session.id
    run.response_id = accepted.response.id
    run.started_at = now
    with transaction.atomic():
        run.save(update_fields=["session_id", "response_id", "started_at"])
        _announce(run, owner_id=task.owner_id)
    return Fire(run_id=run.id, session=session, accepted=accepted)


def fail_run(*, run_id: str, error: str, now: datetime) -> None:
    _finish(run_id, status=ScheduledRun.Status.FAILED, error=error, finished=now)


def settle_runs(*, now: datetime) -> int:
    """Finish the runs whose turn has ended (or whose session or start was lost)."""
    settled = 0
    for run in ScheduledRun.objects.filter(status=ScheduledRun.Status.RUNNING)[:500]:
        status = error = None
        finished = now
        if run.response_id:
            turn = Turn.objects.filter(session_id=run.session_id, id=run.response_id).first()
            if turn is None:
                status, error = ScheduledRun.Status.FAILED, "the session was deleted"
            elif not turn.is_open:
                finished = turn.completed_at or now
                if turn.status == Turn.Status.COMPLETED:
                    status = ScheduledRun.Status.COMPLETED
                else:
                    status = ScheduledRun.Status.FAILED
                    detail = turn.error or {}
                    error = str(detail.get("message") or detail.get("code") or turn.status)
        elif run.started_at is None and run.created_at < _real_now() - STALLED_AFTER:
            status = ScheduledRun.Status.FAILED
            error = "the run did not start: its server process stopped while firing it"
        if status is not None:
            settled += _finish(run.pk, status=status, error=error or "", finished=finished)
    return settled


def _real_now() -> datetime:
    from django.utils import timezone

    return timezone.now()
