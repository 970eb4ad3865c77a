"""Scheduled tasks through the API and the firing pass, on a controllable clock
(automation.md, Schedules): shapes, refusals naming the field, owner-only access, each
occurrence claimed once, the grace rule, skipped runs with reasons, run now and its 409.

The runner is a row that reads online and a fake relay that acknowledges every command,
so a fire goes through the real services (session, binding, message, turn)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import msgspec
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from runners.models import Runner
from schedules import clock, services, upkeep
from schedules.models import ScheduledRun, ScheduledTask
from sessions.models import Item, Permission, Session, Turn
from webhook_outbox.models import WebhookEvent

from .conftest import ALICE, BOB, assert_error, upload

pytestmark = pytest.mark.django_db

TASKS = "/v1/scheduled-tasks"


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def move(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def fake_clock() -> Iterator[Clock]:
    moved = Clock(datetime(2030, 1, 7, 8, 0, 0, tzinfo=UTC))
    clock.use(moved)
    yield moved
    clock.use(None)


@pytest.fixture(autouse=True)
def _keep_test_connection() -> Iterator[None]:
    """The loop's ``database_sync_to_async`` closes old connections around each call,
    the test's transaction among them: plain ``sync_to_async`` here."""
    with (
        mock.patch("schedules.upkeep.database_sync_to_async", sync_to_async),
        mock.patch("schedules.firing.database_sync_to_async", sync_to_async),
    ):
        yield


@pytest.fixture
def relay() -> Iterator[list[Any]]:
    """Every command a fire sends to a runner, acknowledged."""
    sent: list[Any] = []

    async def send_command(*, channel_name: str, command: Any, **_: Any) -> dict[str, Any]:
        sent.append(command)
        return {}

    async def post_command(*, channel_name: str, command: Any) -> None:
        sent.append(command)

    with (
        mock.patch("runners.dispatch.send_command", send_command),
        mock.patch("runners.services.post_command", post_command),
    ):
        yield sent


def online_runner(owner: str, runner_id: str = "runner_token_sched") -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id=runner_id,
        owner=get_or_create_user(owner),
        channel_name=f"specific.{runner_id}!x",
        connected_at=now,
        last_seen_at=now,
    )


@pytest.fixture
def agent_id(client_for: Callable[[str | None], APIClient], make_bundle: Any) -> str:
    response = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(make_bundle("nightly"))}, format="multipart"
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def create(client: APIClient, **fields: Any) -> Any:
    return client.post(TASKS, fields, format="json")


def body(agent_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "agent_id": agent_id,
        "prompt": "Summarise the day",
        "rrule": "FREQ=DAILY;BYHOUR=2;BYMINUTE=0",
        "timezone": "Europe/Paris",
        **extra,
    }


def pass_at(when: datetime, fake: Clock) -> list[str]:
    fake.now = when
    # async_to_sync: the thread-sensitive database calls run on this thread, in the
    # test's transaction.
    return async_to_sync(_pass)()


async def _pass() -> list[str]:
    run_ids = await upkeep.fire_due()
    pending = [task for task in upkeep._fires if not task.done()]
    if pending:
        await asyncio.wait_for(asyncio.gather(*pending), timeout=10)
    return run_ids


# --- the API ----------------------------------------------------------------------------


def test_create_shows_the_task_with_its_next_run_in_the_zone(
    client_for: Callable[[str | None], APIClient], agent_id: str, fake_clock: Clock
) -> None:
    alice = client_for(ALICE)
    response = create(alice, **body(agent_id, max_cost_usd=1.5))
    assert response.status_code == 201, response.content
    task = response.json()
    assert task["id"].startswith("sched_")
    assert task["next_run_at"] == "2030-01-08T02:00:00+01:00"
    assert task["max_cost_usd"] == 1.5
    assert task["session_mode"] == "new" and task["enabled"] is True
    assert task["runner_id"] is None and task["session_id"] is None
    listed = alice.get(TASKS).json()
    assert listed == {"scheduled_tasks": [task], "next_cursor": None}
    assert alice.get(f"{TASKS}/{task['id']}").json() == task


def test_another_users_task_is_404_and_lists_are_own(
    client_for: Callable[[str | None], APIClient], agent_id: str, fake_clock: Clock
) -> None:
    task = create(client_for(ALICE), **body(agent_id)).json()
    bob = client_for(BOB)
    for method, path in [
        ("get", f"{TASKS}/{task['id']}"),
        ("patch", f"{TASKS}/{task['id']}"),
        ("delete", f"{TASKS}/{task['id']}"),
        ("get", f"{TASKS}/{task['id']}/runs"),
        ("post", f"{TASKS}/{task['id']}/run"),
    ]:
        assert_error(getattr(bob, method)(path, {}, format="json"), 404, "not_found")
    assert bob.get(TASKS).json() == {"scheduled_tasks": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rrule": "FREQ=MINUTELY;INTERVAL=2"}, "rrule"),
        ({"rrule": "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=31"}, "rrule"),
        ({"timezone": "Moon/Base"}, "timezone"),
        ({"timezone": None}, "timezone"),
        ({"agent_id": "ag_nope"}, "agent_id"),
        ({"runner_id": "runner_token_nope"}, "runner_id"),
        ({"session_mode": "continue"}, "session_id"),
        ({"session_mode": "later"}, "session_mode"),
        ({"max_cost_usd": "5"}, "max_cost_usd"),
        ({"max_cost_usd": -1}, "max_cost_usd"),
        ({"name": " "}, "name"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    change: dict[str, Any],
    field: str,
) -> None:
    error = assert_error(
        create(client_for(ALICE), **{**body(agent_id), **change}), 400, "invalid_input"
    )
    assert field in error["message"] or field in error.get("fields", {}), error
    assert ScheduledTask.objects.count() == 0


def test_missing_timezone_is_400(
    client_for: Callable[[str | None], APIClient], agent_id: str, fake_clock: Clock
) -> None:
    fields = body(agent_id)
    del fields["timezone"]
    error = assert_error(create(client_for(ALICE), **fields), 400, "invalid_input")
    assert "timezone" in error["fields"]


def test_preview_gives_the_next_five_times_in_the_zone(
    client_for: Callable[[str | None], APIClient], fake_clock: Clock
) -> None:
    alice = client_for(ALICE)
    response = alice.post(
        f"{TASKS}/preview",
        {"rrule": "FREQ=WEEKLY;BYDAY=MO,FR;BYHOUR=9;BYMINUTE=30", "timezone": "America/New_York"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json() == {
        "timezone": "America/New_York",
        "next_runs": [
            "2030-01-07T09:30:00-05:00",
            "2030-01-11T09:30:00-05:00",
            "2030-01-14T09:30:00-05:00",
            "2030-01-18T09:30:00-05:00",
            "2030-01-21T09:30:00-05:00",
        ],
    }
    bad = alice.post(
        f"{TASKS}/preview", {"rrule": "FREQ=MINUTELY", "timezone": "UTC"}, format="json"
    )
    assert "rrule" in assert_error(bad, 400, "invalid_input")["message"]


def test_patch_reschedules_from_now_and_disabling_clears_next_run(
    client_for: Callable[[str | None], APIClient], agent_id: str, fake_clock: Clock
) -> None:
    alice = client_for(ALICE)
    task = create(alice, **body(agent_id)).json()
    url = f"{TASKS}/{task['id']}"
    off = alice.patch(url, {"enabled": False}, format="json").json()
    assert off["enabled"] is False and off["next_run_at"] is None
    fake_clock.move(days=3)
    on = alice.patch(url, {"enabled": True, "timezone": "UTC"}, format="json").json()
    assert on["next_run_at"] == "2030-01-11T02:00:00+00:00"
    assert alice.delete(url).json() == {"id": task["id"], "deleted": True}
    assert_error(alice.get(url), 404, "not_found")


# --- firing -------------------------------------------------------------------------------


@pytest.mark.usefixtures("webhook_subscriber")
def test_a_due_occurrence_fires_once_into_a_new_session(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
) -> None:
    alice = client_for(ALICE)
    online_runner(ALICE)
    task = create(alice, **body(agent_id, max_cost_usd=2)).json()
    due = datetime(2030, 1, 8, 1, 0, tzinfo=UTC)  # 02:00 in Paris
    assert pass_at(due - timedelta(seconds=1), fake_clock) == []
    fired = pass_at(due, fake_clock)
    assert len(fired) == 1
    assert pass_at(due + timedelta(seconds=1), fake_clock) == []  # claimed: not again
    run = alice.get(f"{TASKS}/{task['id']}/runs").json()["runs"][0]
    assert run["status"] == "running" and run["trigger"] == "schedule"
    assert run["scheduled_for"] == "2030-01-08T02:00:00+01:00"
    assert run["budget_usd"] == 2.0
    session = Session.objects.get(pk=run["session_id"])
    assert session.title == "nightly · 2030-01-08 02:00"
    assert session.runner_id == "runner_token_sched" and session.created_by is not None
    assert session.created_by.username == ALICE
    message = Item.objects.get(session=session, type="message")
    assert message.data["content"][0]["text"] == "Summarise the day"
    assert message.created_by == ALICE
    assert [type(command).__name__ for command in relay][-1] == "TurnStart"
    # The turn ends: the next pass settles the run.
    Turn.objects.filter(id=run["response_id"]).update(status="completed", completed_at=due)
    pass_at(due + timedelta(seconds=2), fake_clock)
    settled = alice.get(f"{TASKS}/{task['id']}/runs").json()["runs"][0]
    assert settled["status"] == "completed" and settled["finished_at"]
    assert alice.get(f"{TASKS}/{task['id']}").json()["next_run_at"] == "2030-01-09T02:00:00+01:00"
    # Each change of the run is a webhook event for the owner, written with it.
    events = list(WebhookEvent.objects.filter(type__startswith="schedule.").order_by("created_at"))
    assert [(e.type, e.data["run"]["status"]) for e in events] == [
        ("schedule.run_started", "running"),
        ("schedule.run_finished", "completed"),
    ]
    assert events[0].owner_id == get_or_create_user(ALICE).pk
    assert events[0].data["session_id"] == run["session_id"]


def test_missed_occurrences_fire_once_within_grace_else_are_skipped_missed(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
    settings: Any,
) -> None:
    settings.OMNIGENT_SCHEDULE_GRACE_S = 300
    alice = client_for(ALICE)
    online_runner(ALICE)
    task = create(alice, **body(agent_id, rrule="FREQ=HOURLY;BYMINUTE=0", timezone="UTC")).json()
    # Down from 08:00 to 11:04: three occurrences passed, the last 4 minutes ago.
    assert len(pass_at(datetime(2030, 1, 7, 11, 4, tzinfo=UTC), fake_clock)) == 1
    runs = alice.get(f"{TASKS}/{task['id']}/runs").json()["runs"]
    assert [(r["scheduled_for"], r["status"]) for r in runs] == [
        ("2030-01-07T11:00:00+00:00", "running")
    ]
    Turn.objects.update(status="completed")
    # Down again until 14:30: the 14:00 occurrence is 30 minutes late.
    assert pass_at(datetime(2030, 1, 7, 14, 30, tzinfo=UTC), fake_clock) == []
    latest = alice.get(f"{TASKS}/{task['id']}/runs").json()["runs"][0]
    assert latest["scheduled_for"] == "2030-01-07T14:00:00+00:00"
    assert latest["status"] == "skipped" and latest["error"].startswith("missed")
    assert ScheduledRun.objects.count() == 2  # one catch-up at most, per pass
    assert alice.get(f"{TASKS}/{task['id']}").json()["next_run_at"] == "2030-01-07T15:00:00+00:00"


def test_skipped_runs_say_why(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
) -> None:
    alice = client_for(ALICE)
    task = create(alice, **body(agent_id, rrule="FREQ=HOURLY;BYMINUTE=0", timezone="UTC")).json()
    runs_url = f"{TASKS}/{task['id']}/runs"
    pass_at(datetime(2030, 1, 7, 9, 0, tzinfo=UTC), fake_clock)
    assert alice.get(runs_url).json()["runs"][0]["error"] == "no runner of the owner is online"
    online_runner(ALICE)
    pass_at(datetime(2030, 1, 7, 10, 0, tzinfo=UTC), fake_clock)
    assert alice.get(runs_url).json()["runs"][0]["status"] == "running"
    pass_at(datetime(2030, 1, 7, 11, 0, tzinfo=UTC), fake_clock)
    assert alice.get(runs_url).json()["runs"][0]["error"] == services.STILL_RUNNING
    Turn.objects.update(status="failed", error={"code": "x", "message": "model refused"})
    user = get_or_create_user(ALICE)
    user.is_active = False
    user.save()
    pass_at(datetime(2030, 1, 7, 12, 0, tzinfo=UTC), fake_clock)
    # A disabled user cannot read the API any more: the rows say it.
    runs = [(r.status, r.error) for r in ScheduledRun.objects.order_by("-scheduled_for")]
    assert runs[0] == ("skipped", "the owner's account is disabled")
    assert ("failed", "model refused") in runs


def test_continue_mode_posts_to_the_session(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
) -> None:
    alice = client_for(ALICE)
    online_runner(ALICE)
    session_id = alice.post("/v1/sessions", {"agent_id": agent_id}, format="json").json()["id"]
    Session.objects.filter(pk=session_id).update(runner_id="runner_token_sched")
    task = create(
        alice, **body(agent_id, session_mode="continue", session_id=session_id, timezone="UTC")
    ).json()
    run = alice.post(f"{TASKS}/{task['id']}/run").json()
    assert run["status"] == "running" and run["session_id"] == session_id
    assert run["trigger"] == "manual"
    assert Item.objects.filter(session_id=session_id, type="message").count() == 1


def test_run_now_is_409_while_a_run_is_in_flight(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
) -> None:
    alice = client_for(ALICE)
    online_runner(ALICE)
    task = create(alice, **body(agent_id)).json()
    first = alice.post(f"{TASKS}/{task['id']}/run")
    assert first.status_code == 202, first.content
    assert first.json()["status"] == "running"
    assert_error(alice.post(f"{TASKS}/{task['id']}/run"), 409, "conflict")
    Turn.objects.update(status="completed")
    services.settle_runs(now=fake_clock.now)
    fake_clock.move(seconds=1)
    assert alice.post(f"{TASKS}/{task['id']}/run").status_code == 202


def test_two_claimers_of_one_occurrence_fire_it_once(
    client_for: Callable[[str | None], APIClient], agent_id: str, fake_clock: Clock
) -> None:
    """The unique (task, scheduled_for) row is the backstop when two processes read the
    task as due at once (here: the second claims with the task's stale next_run_at)."""
    create(client_for(ALICE), **body(agent_id, timezone="UTC"))
    due = datetime(2030, 1, 8, 2, 0, tzinfo=UTC)
    task = ScheduledTask.objects.get()
    first = services.claim_due(now=due, grace_s=300, process_id="srv_a")
    ScheduledTask.objects.filter(pk=task.pk).update(next_run_at=due)  # as B saw it
    second = services.claim_due(now=due, grace_s=300, process_id="srv_b")
    assert len(first) == 1 and second == []
    assert ScheduledRun.objects.filter(task=task, scheduled_for=due).count() == 1
    assert ScheduledTask.objects.get().next_run_at == due + timedelta(days=1)


def test_every_server_process_runs_the_firing_loop() -> None:
    from omnigent_site.runtime import background

    assert "schedules.upkeep.fire_due_forever" in background.registered()


def test_max_cost_is_the_runs_session_budget_with_deny(
    client_for: Callable[[str | None], APIClient],
    agent_id: str,
    fake_clock: Clock,
    relay: list[Any],
) -> None:
    """New session: the budget is max_cost_usd, sent with its ``session.open`` and the
    turn's ``turn.start``; continue: what the session spent so far plus max_cost_usd."""
    alice = client_for(ALICE)
    online_runner(ALICE)
    task = create(alice, **body(agent_id, max_cost_usd=2, timezone="UTC")).json()
    run = alice.post(f"{TASKS}/{task['id']}/run").json()
    session = Session.objects.get(pk=run["session_id"])
    assert (session.budget_nano, session.on_budget) == (2_000_000_000, "deny")
    line = {"scope": "session", "limit_nano": 2_000_000_000, "spent_nano": 0, "on_budget": "deny"}
    sent = {type(command).__name__: command for command in relay}
    for name in ("SessionOpen", "TurnStart"):
        assert sent[name].budgets.session is not None, name
        assert msgspec.structs.asdict(sent[name].budgets.session) == line, name

    spent = Session.objects.create(
        agent_id=session.agent_id, created_by=session.created_by, runner_id="runner_token_sched"
    )
    Permission.objects.create(session=spent, user=session.created_by, level=4)
    Session.objects.filter(pk=spent.pk).update(total_cost_nano=300_000_000)
    again = create(
        alice,
        **body(
            agent_id,
            name="again",
            max_cost_usd=1,
            session_mode="continue",
            session_id=spent.pk,
            timezone="UTC",
        ),
    ).json()
    continued = alice.post(f"{TASKS}/{again['id']}/run").json()
    assert continued["status"] == "running", continued
    spent.refresh_from_db()
    assert (spent.budget_nano, spent.on_budget) == (1_300_000_000, "deny")
