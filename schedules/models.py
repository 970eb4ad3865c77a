"""Scheduled tasks and their runs (automation.md, Schedules).

A task refers to its agent, runner and (``continue``) session by id, not by foreign
key: each is checked when the task is saved and again at every fire, and a run whose
agent, runner or session is gone is recorded ``skipped`` with the reason instead of
the task vanishing or blocking a delete.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def new_task_id() -> str:
    return f"sched_{secrets.token_hex(12)}"


def new_run_id() -> str:
    return f"srun_{secrets.token_hex(12)}"


class ScheduledTask(models.Model):
    class Mode(models.TextChoices):
        NEW = "new"
        CONTINUE = "continue"

    id = models.CharField(primary_key=True, max_length=64, default=new_task_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scheduled_tasks"
    )
    name = models.CharField(max_length=200)
    agent_id = models.CharField(max_length=64)
    prompt = models.TextField()
    # As the client sent it, and its parsed parts (schedules/rules.py): the RRULE body
    # and the start in the zone's wall time; the anchor is the occurrence expansion
    # starts from (the last one reached).
    rrule = models.TextField()
    rule_body = models.TextField()
    timezone = models.CharField(max_length=64)
    dtstart_local = models.CharField(max_length=19)
    anchor_local = models.CharField(max_length=19)
    runner_id = models.CharField(max_length=64, blank=True, default="")
    enabled = models.BooleanField(default=True)
    max_cost_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    session_mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.NEW)
    session_id = models.CharField(max_length=64, blank=True, default="")
    # The next occurrence to fire; null when disabled or the rule has ended.
    next_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["enabled", "next_run_at"], name="sched_due"),
            models.Index(fields=["owner", "created_at"], name="sched_owner_created"),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduledRun(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        SKIPPED = "skipped"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule"
        MANUAL = "manual"

    id = models.CharField(primary_key=True, max_length=64, default=new_run_id, editable=False)
    task = models.ForeignKey(ScheduledTask, on_delete=models.CASCADE, related_name="runs")
    # The occurrence (or, for "run now", the moment it was asked for). Unique per task:
    # inserting this row is the claim that makes a fire happen once.
    scheduled_for = models.DateTimeField()
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SCHEDULE)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    session_id = models.CharField(max_length=64, blank=True, default="")
    response_id = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    cost_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # The task's max_cost_usd when it fired: the run's session budget (usage.md).
    budget_usd = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # The server process that claimed it (runners.liveness.PROCESS_ID).
    claimed_by = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "scheduled_for"], name="srun_once_per_occurrence"
            )
        ]
        indexes = [
            models.Index(fields=["task", "-scheduled_for"], name="srun_task_newest"),
            models.Index(fields=["status"], name="srun_status"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} @ {self.scheduled_for:%Y-%m-%d %H:%M}"

    @property
    def in_flight(self) -> bool:
        return self.status == self.Status.RUNNING
