"""The schema-conformance scenario's part for scheduled tasks (automation.md)."""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from schedules.models import ScheduledRun, ScheduledTask

TASKS = "/v1/scheduled-tasks"
TASK = TASKS + "/{task_id}"


def exercise_schedules(alice: Any, bob: Any, anon: Any, template: str) -> None:
    """The first caller owns the task: one with no runner (its run now is skipped
    without waiting for a runner); the second is another user."""
    fields = {
        "name": "nightly",
        "agent_id": template,
        "prompt": "hello",
        "rrule": "FREQ=DAILY;BYHOUR=2;BYMINUTE=0",
        "timezone": "Europe/Paris",
        "max_cost_usd": 0.5,
    }
    created = alice("post", TASKS, fields)
    assert created.status_code == 201, created.content
    task_id = created.json()["id"]
    preview = {"rrule": "FREQ=WEEKLY", "timezone": "UTC"}
    statuses = [
        alice("post", TASKS, {**fields, "rrule": "FREQ=MINUTELY"}),
        alice("post", TASKS, "x", content_type="text/plain"),
        anon("post", TASKS, fields),
        alice("get", TASKS),
        alice("get", TASKS, query="?limit=0"),
        anon("get", TASKS),
        alice("post", TASKS + "/preview", preview),
        alice("post", TASKS + "/preview", {**preview, "timezone": "Nowhere/Land"}),
        alice("post", TASKS + "/preview", "x", content_type="text/plain"),
        anon("post", TASKS + "/preview", preview),
        alice("get", TASK, task_id=task_id),
        bob("get", TASK, task_id=task_id),
        anon("get", TASK, task_id=task_id),
        alice("patch", TASK, {"enabled": False}, task_id=task_id),
        alice("patch", TASK, {"rrule": "nope"}, task_id=task_id),
        alice("patch", TASK, "x", content_type="text/plain", task_id=task_id),
        bob("patch", TASK, {"enabled": True}, task_id=task_id),
        anon("patch", TASK, {"enabled": True}, task_id=task_id),
        alice("post", TASK + "/run", task_id=task_id),  # no runner: skipped, with why
        alice("get", TASK + "/runs", task_id=task_id),
        alice("get", TASK + "/runs", query="?after=srun_nope", task_id=task_id),
        bob("get", TASK + "/runs", task_id=task_id),
        anon("get", TASK + "/runs", task_id=task_id),
        bob("post", TASK + "/run", task_id=task_id),
        anon("post", TASK + "/run", task_id=task_id),
    ]
    assert [r.status_code for r in statuses] == [
        *[400, 415, 401],
        *[200, 400, 401],
        *[200, 400, 415, 401],
        *[200, 404, 401],
        *[200, 400, 415, 404, 401],
        202,
        *[200, 400, 404, 401],
        *[404, 401],
    ], [r.status_code for r in statuses]
    assert statuses[18].json()["status"] == "skipped", statuses[18].json()
    ScheduledRun.objects.create(
        task=ScheduledTask.objects.get(pk=task_id),
        scheduled_for=ScheduledRun.objects.get().scheduled_for.replace(year=2099),
    )
    assert alice("post", TASK + "/run", task_id=task_id).status_code == 409
    padding = "x" * 4096
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        large = [
            alice("post", TASKS, {**fields, "prompt": padding}),
            alice("post", TASKS + "/preview", {**preview, "rrule": padding}),
            alice("patch", TASK, {"prompt": padding}, task_id=task_id),
        ]
    assert [r.status_code for r in large] == [413] * 3
    assert [r.status_code for r in (bob("delete", TASK, task_id=task_id),)] == [404]
    assert anon("delete", TASK, task_id=task_id).status_code == 401
    assert alice("delete", TASK, task_id=task_id).status_code == 200
