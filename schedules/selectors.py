"""Reads of scheduled tasks: a task is its owner's (admins see every one); anyone
else gets 404, as for a missing task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet

from omnigent_site.domain_errors import InvalidInput, NotFound
from omnigent_site.users import is_admin

from .models import ScheduledRun, ScheduledTask

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser


def tasks_of(*, user: AuthUser) -> QuerySet[ScheduledTask]:
    """``GET /v1/scheduled-tasks``: the caller's own tasks, newest first."""
    return ScheduledTask.objects.filter(owner=user).order_by("-created_at", "-id")


def task_for(*, user: AuthUser, task_id: str) -> ScheduledTask:
    task = ScheduledTask.objects.select_related("owner").filter(pk=task_id).first()
    if task is None or (task.owner_id != user.pk and not is_admin(user)):
        raise NotFound(f"scheduled task {task_id!r} not found")
    return task


def runs_of(*, task: ScheduledTask) -> QuerySet[ScheduledRun]:
    """A task's runs, newest occurrence first."""
    return ScheduledRun.objects.filter(task=task).order_by("-scheduled_for", "-id")


def page_after(
    queryset: QuerySet, *, after: str | None, limit: int, time_field: str
) -> tuple[list, str | None]:
    """One page of a newest-first list; the cursor is the last row's id."""
    if after:
        last = queryset.filter(pk=after).values(time_field, "id").first()
        if last is None:
            raise InvalidInput("unknown cursor", field="after")
        queryset = queryset.filter(
            Q(**{f"{time_field}__lt": last[time_field]})
            | Q(**{time_field: last[time_field], "id__lt": last["id"]})
        )
    rows = list(queryset[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].pk if more and rows else None)
