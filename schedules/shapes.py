"""Response shapes of scheduled tasks and runs (automation.md): times in ISO 8601 with
the offset of the task's time zone, as the reference sends them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

from typing_extensions import Doc, TypedDict

from .models import ScheduledRun, ScheduledTask


def iso(value: datetime | None, zone: ZoneInfo) -> str | None:
    return value.astimezone(zone).isoformat() if value is not None else None


def _money(value: object) -> float | None:
    return float(value) if value is not None else None  # type: ignore[arg-type]


class ScheduledTaskOut(TypedDict):
    id: Annotated[str, Doc("`sched_…`")]
    name: str
    agent_id: str
    prompt: str
    rrule: Annotated[str, Doc("the RFC 5545 rule as sent")]
    timezone: Annotated[str, Doc("IANA zone the rule is evaluated in")]
    runner_id: str | None
    enabled: bool
    max_cost_usd: Annotated[float | None, Doc("each run's session budget (on_budget: deny)")]
    session_mode: Literal["new", "continue"]
    session_id: str | None
    next_run_at: Annotated[str | None, Doc("the next occurrence; null when disabled or ended")]
    created_at: str
    updated_at: str


def task_body(task: ScheduledTask) -> ScheduledTaskOut:
    zone = ZoneInfo(task.timezone)
    return {
        "id": task.id,
        "name": task.name,
        "agent_id": task.agent_id,
        "prompt": task.prompt,
        "rrule": task.rrule,
        "timezone": task.timezone,
        "runner_id": task.runner_id or None,
        "enabled": task.enabled,
        "max_cost_usd": _money(task.max_cost_usd),
        "session_mode": task.session_mode,  # type: ignore[typeddict-item]
        "session_id": task.session_id or None,
        "next_run_at": iso(task.next_run_at, zone),
        "created_at": iso(task.created_at, zone) or "",
        "updated_at": iso(task.updated_at, zone) or "",
    }


class ScheduledTaskList(TypedDict):
    """The caller's tasks, newest first; ``next_cursor`` is the next page's ``after``."""

    scheduled_tasks: list[ScheduledTaskOut]
    next_cursor: str | None


def task_list_body(tasks: list[ScheduledTask], *, next_cursor: str | None) -> ScheduledTaskList:
    return {"scheduled_tasks": [task_body(task) for task in tasks], "next_cursor": next_cursor}


class ScheduledTaskDeletedOut(TypedDict):
    id: str
    deleted: Literal[True]


def task_deleted_body(task_id: str) -> ScheduledTaskDeletedOut:
    return {"id": task_id, "deleted": True}


class ScheduledRunOut(TypedDict):
    id: Annotated[str, Doc("`srun_…`")]
    task_id: str
    scheduled_for: Annotated[str, Doc("the occurrence (for a run now: when it was asked)")]
    trigger: Literal["schedule", "manual"]
    started_at: str | None
    finished_at: str | None
    status: Literal["running", "completed", "failed", "skipped"]
    session_id: str | None
    response_id: str | None
    error: Annotated[str | None, Doc("why it failed or was skipped")]
    cost_usd: Annotated[float | None, Doc("null until usage is recorded (usage.md)")]
    budget_usd: Annotated[float | None, Doc("the task's max_cost_usd when it fired")]


def run_body(run: ScheduledRun, *, zone: ZoneInfo) -> ScheduledRunOut:
    return {
        "id": run.id,
        "task_id": run.task_id,
        "scheduled_for": iso(run.scheduled_for, zone) or "",
        "trigger": run.trigger,  # type: ignore[typeddict-item]
        "started_at": iso(run.started_at, zone),
        "finished_at": iso(run.finished_at, zone),
        "status": run.status,  # type: ignore[typeddict-item]
        "session_id": run.session_id or None,
        "response_id": run.response_id or None,
        "error": run.error or None,
        "cost_usd": _money(run.cost_usd),
        "budget_usd": _money(run.budget_usd),
    }


class ScheduledRunList(TypedDict):
    """A task's runs, newest first."""

    runs: list[ScheduledRunOut]
    next_cursor: str | None


def run_list_body(
    runs: list[ScheduledRun], *, zone: ZoneInfo, next_cursor: str | None
) -> ScheduledRunList:
    return {"runs": [run_body(run, zone=zone) for run in runs], "next_cursor": next_cursor}


class SchedulePreviewOut(TypedDict):
    """The next occurrences of a rule, as a task created now would fire them."""

    timezone: str
    next_runs: Annotated[list[str], Doc("five ISO 8601 times with the zone's offset")]


def preview_body(times: list[datetime], *, zone: ZoneInfo) -> SchedulePreviewOut:
    return {"timezone": zone.key, "next_runs": [iso(time, zone) or "" for time in times]}
