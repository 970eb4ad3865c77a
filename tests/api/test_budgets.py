"""Budgets over HTTP (usage.md, Budgets): the session's ``budget_usd`` (PATCH, rows,
snapshot, ETag), users' daily budgets (``GET|PUT /v1/users/{id}/budget``, staff only),
each change audited once; messages refused with 409/429 ``budget_exceeded`` storing
nothing; accepted budget questions raising the budget (a user's: staff only); the
``budget.exceeded`` webhook event."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from omnigent_runner import protocol
from omnigent_site.users import get_or_create_user
from runners import runner_events
from sessions import approvals, budgets
from sessions.models import Approval, Item, Session, Turn
from usage import selectors as usage_selectors
from usage import services as usage_services
from usage.models import DailyUsage, UserBudget, UserBudgetRaise
from webhook_outbox.models import WebhookEvent

from .conftest import ALICE, BOB, CAROL, assert_error
from .test_usage_recording import bound_session, message, send

pytestmark = pytest.mark.django_db

NANO = 1_000_000_000
ROOT = "root@example.com"
# 18:00 UTC: six hours to the next UTC day.
EVENING = datetime(2026, 3, 4, 18, 0, tzinfo=UTC)
MESSAGE = {"type": "message", "data": {"role": "user", "content": "hi"}}


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fixed clock; the process's list of users with a budget read afresh (an earlier
    test's rolled-back rows may be in it)."""
    monkeypatch.setattr(usage_services, "clock", lambda: EVENING)
    usage_selectors.forget_budgeted_users()
    yield
    usage_selectors.forget_budgeted_users()


@pytest.fixture
def root() -> Any:
    return get_user_model().objects.create_user(username=ROOT, is_staff=True)


def budget_records() -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action="budget.change").order_by("at", "id"))


def spend_today(username: str, usd: float) -> None:
    """The user's pre-summed spend of the clock's day, as recorded calls leave it."""
    user = get_or_create_user(username)
    DailyUsage.objects.create(
        user_id=user.pk,
        day=EVENING.date(),
        model="gpt-4o-mini",
        llm_calls=1,
        priced_calls=1,
        cost_nano=int(usd * NANO),
    )


# --- the session's budget ---------------------------------------------------------------


def test_patch_sets_shows_and_removes_the_budget_audited_once_each(
    client_for, create_session
) -> None:
    session_id = create_session()
    client = client_for(ALICE)
    before = client.get(f"/v1/sessions/{session_id}")
    assert before.json()["budget_usd"] is None
    response = client.patch(f"/v1/sessions/{session_id}", {"budget_usd": 2.5}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["budget_usd"] == 2.5
    assert response["ETag"] != before["ETag"]
    assert Session.objects.get(pk=session_id).budget_nano == 2_500_000_000
    rows = client.get("/v1/sessions").json()["data"]
    assert [row["budget_usd"] for row in rows] == [2.5]
    [record] = budget_records()
    assert (record.actor, record.target_type, record.target_id) == (ALICE, "session", session_id)
    assert record.details["old_budget_usd"] is None
    assert record.details["new_budget_usd"] == 2.5

    removed = client.patch(f"/v1/sessions/{session_id}", {"budget_usd": None}, format="json")
    assert removed.json()["budget_usd"] is None
    assert Session.objects.get(pk=session_id).budget_nano is None
    assert len(budget_records()) == 2
    assert budget_records()[1].details["old_budget_usd"] == 2.5


@pytest.mark.parametrize("value", ["2.5", True, -1, 1e7, {"usd": 1}, [1]])
def test_a_bad_budget_is_400_naming_the_field_and_changes_nothing(
    client_for, create_session, value
) -> None:
    session_id = create_session()
    response = client_for(ALICE).patch(
        f"/v1/sessions/{session_id}", {"budget_usd": value}, format="json"
    )
    error = assert_error(response, 400, "invalid_input")
    assert "budget_usd" in error["fields"]
    assert Session.objects.get(pk=session_id).budget_nano is None
    assert budget_records() == []


def test_only_managers_set_the_budget(client_for, create_session, grant) -> None:
    session_id = create_session()
    grant(session_id, BOB, 2)  # edit
    response = client_for(BOB).patch(f"/v1/sessions/{session_id}", {"budget_usd": 9}, format="json")
    assert_error(response, 403, "forbidden")
    grant(session_id, CAROL, 3)  # manage
    response = client_for(CAROL).patch(
        f"/v1/sessions/{session_id}", {"budget_usd": 9}, format="json"
    )
    assert response.status_code == 200, response.content
    assert [record.actor for record in budget_records()] == [CAROL]


# --- users' daily budgets ---------------------------------------------------------------


def test_staff_put_and_get_a_users_daily_budget_audited(client_for, create_session, root):
    create_session(BOB)
    spend_today(BOB, 0.25)
    client = client_for(ROOT)
    response = client.put(f"/v1/users/{BOB}/budget", {"daily_usd": 20}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "object": "user_budget",
        "user_id": BOB,
        "daily_usd": 20.0,
        "default_daily_usd": None,
        "effective_daily_usd": 20.0,
        "raised_today_usd": 0.0,
        "spent_today_usd": 0.25,
    }
    assert client.get(f"/v1/users/{BOB}/budget").json()["daily_usd"] == 20.0
    [record] = budget_records()
    assert (record.actor, record.target_type, record.target_id) == (ROOT, "user", BOB)
    assert (record.details["old_daily_usd"], record.details["new_daily_usd"]) == (None, 20.0)

    cleared = client.put(f"/v1/users/{BOB}/budget", {"daily_usd": None}, format="json")
    assert cleared.json()["daily_usd"] is None
    assert not UserBudget.objects.exists()
    assert len(budget_records()) == 2


def test_the_server_default_applies_to_users_without_their_own(
    client_for, create_session, root, settings
) -> None:
    settings.OMNIGENT_DAILY_BUDGET_USD = 5.0
    create_session(BOB)
    body = client_for(ROOT).get(f"/v1/users/{BOB}/budget").json()
    assert (body["daily_usd"], body["default_daily_usd"], body["effective_daily_usd"]) == (
        None,
        5.0,
        5.0,
    )


def test_user_budgets_are_staff_only_and_unknown_users_404(client_for, create_session, root):
    create_session(BOB)
    assert_error(client_for(ALICE).get(f"/v1/users/{BOB}/budget"), 403, "forbidden")
    put = client_for(BOB).put(f"/v1/users/{BOB}/budget", {"daily_usd": 1}, format="json")
    assert_error(put, 403, "forbidden")
    assert_error(client_for(ROOT).get("/v1/users/nobody@example.com/budget"), 404, "not_found")
    for body in ({"daily_usd": "20"}, {}, {"daily_usd": -1}, {"daily_usd": 1, "extra": 1}):
        response = client_for(ROOT).put(f"/v1/users/{BOB}/budget", body, format="json")
        assert_error(response, 400, "invalid_input")
    assert budget_records() == []
    assert not UserBudget.objects.exists()


# --- messages the budgets refuse --------------------------------------------------------


def stored_counts(session_id: str) -> tuple[int, int]:
    return (
        Item.objects.filter(session_id=session_id).count(),
        Turn.objects.filter(session_id=session_id).count(),
    )


@pytest.mark.usefixtures("webhook_subscriber")
def test_a_spent_session_budget_with_deny_is_409_and_stores_nothing(
    client_for, create_session
) -> None:
    session_id = create_session()
    session = Session.objects.get(pk=session_id)
    budgets.set_session_budget(session=session, actor=None, budget_nano=NANO, on_budget="deny")
    Session.objects.filter(pk=session_id).update(total_cost_nano=NANO)
    response = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(response, 409, "budget_exceeded", mentions="budget")
    assert stored_counts(session_id) == (0, 0)
    [event] = WebhookEvent.objects.filter(type="budget.exceeded")
    assert event.session_id == session_id
    assert event.data["scope"] == "session"
    assert (event.data["budget_usd"], event.data["spent_usd"]) == (1.0, 1.0)
    assert event.data["error"]["code"] == "budget_exceeded"


def test_a_spent_budget_with_ask_is_not_refused_up_front(client_for, create_session) -> None:
    """The runner asks before the next call instead; here no runner is bound (503)."""
    session_id = create_session()
    session = Session.objects.get(pk=session_id)
    budgets.set_session_budget(session=session, actor=None, budget_nano=NANO)
    Session.objects.filter(pk=session_id).update(total_cost_nano=2 * NANO)
    response = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(response, 503, "runner_unavailable")


def test_a_bundle_budget_with_deny_refuses_too(client_for, make_bundle) -> None:
    from .conftest import upload

    bundle = make_bundle(extra="guardrails:\n  budget_usd: 0.5\n  on_budget: deny\n")
    created = client_for(ALICE).post(
        "/v1/sessions", {"metadata": "{}", "bundle": upload(bundle)}, format="multipart"
    )
    assert created.status_code == 201, created.content
    session_id = created.json()["session_id"]
    Session.objects.filter(pk=session_id).update(total_cost_nano=NANO // 2)
    response = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(response, 409, "budget_exceeded")
    assert stored_counts(session_id) == (0, 0)


@pytest.mark.usefixtures("webhook_subscriber")
def test_a_user_over_the_daily_budget_is_429_until_midnight_utc(
    client_for, create_session, settings
) -> None:
    settings.OMNIGENT_DAILY_BUDGET_USD = 1.0
    session_id = create_session()
    spend_today(ALICE, 1.0)
    response = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(response, 429, "budget_exceeded", mentions="daily budget")
    assert response["Retry-After"] == str(6 * 3600)
    assert stored_counts(session_id) == (0, 0)
    [event] = WebhookEvent.objects.filter(type="budget.exceeded")
    assert event.data["scope"] == "user"
    # Yesterday's spend does not count today.
    DailyUsage.objects.update(day=date(2026, 3, 3))
    again = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(again, 503, "runner_unavailable")


def test_seconds_to_midnight() -> None:
    assert budgets.seconds_to_next_utc_midnight(EVENING) == 6 * 3600
    assert budgets.seconds_to_next_utc_midnight(datetime(2026, 3, 4, 23, 59, 59, 500000, UTC)) == 1


# --- budget questions -------------------------------------------------------------------


def budget_question(session_id: str, *, scope: str) -> Approval:
    _item, turn = runner_events.accept_message(
        session_id=session_id,
        created_by=ALICE,
        data={"role": "user", "content": [{"type": "input_text", "text": "go"}]},
        tools=[],
    )
    event = protocol.ApprovalRequested(
        response_id=turn.id,
        call_id="budget_1",
        tool="",
        phase="budget",
        arguments={
            "kind": "budget",
            "scope": scope,
            "budget_usd": 2.0,
            "spent_usd": 2.01,
            "increment_usd": 1.5,
        },
        policy_name="budget",
        reason="budget spent",
        ask_timeout=600.0,
    )
    session = Session.objects.get(pk=session_id)
    return approvals.record_requested(session=session, turn=turn, event=event).approval


def resolve(client: Any, session_id: str, eid: str, action: str) -> Any:
    return client.post(
        f"/v1/sessions/{session_id}/elicitations/{eid}/resolve", {"action": action}, format="json"
    )


def test_a_budget_question_shows_phase_budget_and_its_numbers(client_for, create_session):
    session_id = create_session()
    approval = budget_question(session_id, scope="session")
    [pending] = client_for(ALICE).get(f"/v1/sessions/{session_id}").json()["pending_elicitations"]
    params = pending["params"]
    assert params["phase"] == "budget"
    assert params["policy_name"] == "budget"
    assert (params["kind"], params["scope"], params["budget_usd"]) == ("budget", "session", 2.0)
    assert params["message"] == approval.message
    assert approval.message == (
        "Budget reached: spent $2.01 of $2.00 (the session's budget) — allow $1.50 more?"
    )


def test_accepting_a_session_budget_question_raises_the_budget(client_for, create_session):
    session_id = create_session()
    approval = budget_question(session_id, scope="session")
    response = resolve(client_for(ALICE), session_id, approval.id, "accept")
    assert response.status_code == 202, response.content
    assert Session.objects.get(pk=session_id).budget_nano == 3_500_000_000
    [record] = budget_records()
    assert record.details["via"] == "approval"
    assert record.details["new_budget_usd"] == 3.5


def test_declining_a_budget_question_raises_nothing(client_for, create_session):
    session_id = create_session()
    approval = budget_question(session_id, scope="session")
    assert resolve(client_for(ALICE), session_id, approval.id, "decline").status_code == 202
    assert Session.objects.get(pk=session_id).budget_nano is None
    assert budget_records() == []


def test_only_staff_accept_a_user_budget_question(client_for, create_session, grant, root):
    session_id = create_session()
    grant(session_id, ROOT, 2)
    approval = budget_question(session_id, scope="user")
    refused = resolve(client_for(ALICE), session_id, approval.id, "accept")
    assert_error(refused, 403, "forbidden", mentions="staff")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING
    assert not UserBudgetRaise.objects.exists()

    accepted = resolve(client_for(ROOT), session_id, approval.id, "accept")
    assert accepted.status_code == 202, accepted.content
    alice = get_or_create_user(ALICE)
    [raised] = UserBudgetRaise.objects.all()
    assert (raised.user_id, raised.day, raised.raised_nano) == (
        alice.pk,
        EVENING.date(),
        1_500_000_000,
    )
    [record] = budget_records()
    assert (record.actor, record.target_id, record.details["via"]) == (ROOT, ALICE, "approval")


def test_the_owner_may_decline_a_user_budget_question(client_for, create_session):
    session_id = create_session()
    approval = budget_question(session_id, scope="user")
    assert resolve(client_for(ALICE), session_id, approval.id, "decline").status_code == 202
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.DECLINED


def test_a_raise_adds_to_the_daily_limit_the_runner_gets(create_session, settings) -> None:
    settings.OMNIGENT_DAILY_BUDGET_USD = 1.0
    session_id = create_session()
    alice = get_or_create_user(ALICE)
    spend_today(ALICE, 0.5)
    usage_services.raise_daily_budget(user_id=alice.pk, day=EVENING.date(), by_nano=NANO // 4)
    usage_services.raise_daily_budget(user_id=alice.pk, day=EVENING.date(), by_nano=NANO // 4)
    line = budgets.budgets_for(Session.objects.get(pk=session_id)).user
    assert line == protocol.BudgetLine(
        scope="user", limit_nano=1_500_000_000, spent_nano=500_000_000
    )


@pytest.mark.usefixtures("webhook_subscriber")
def test_a_turn_failed_budget_exceeded_is_a_webhook_event(create_session) -> None:
    session_id = create_session()
    _item, turn = runner_events.accept_message(
        session_id=session_id,
        created_by=ALICE,
        data={"role": "user", "content": [{"type": "input_text", "text": "go"}]},
        tools=[],
    )
    runner_events.fail_turn(
        session_id=session_id,
        response_id=turn.id,
        code="budget_exceeded",
        message="the session's budget is spent",
    )
    [event] = WebhookEvent.objects.filter(type="budget.exceeded")
    assert (event.data["response_id"], event.data["status"]) == (turn.id, "failed")
    assert event.data["error"]["code"] == "budget_exceeded"


@pytest.mark.usefixtures("webhook_subscriber")
@pytest.mark.parametrize(
    ("named", "amounts"),
    [
        (
            {"scope": "user", "budget_usd": 1.0, "spent_usd": 1.25},
            {"scope": "user", "budget_usd": 1.0, "spent_usd": 1.25},
        ),
        # An older runner's error names no budget.
        ({}, {"scope": None, "budget_usd": None, "spent_usd": None}),
    ],
)
def test_a_runner_side_budget_failure_names_its_budget_in_the_webhook_event(
    client_for, create_session, named: dict[str, Any], amounts: dict[str, Any]
) -> None:
    """The runner's ``budget_exceeded`` error carries the budget it stopped at
    (protocol.md, Budgets); the turn stores only its code and message."""
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    sentence = "the user budget is spent: $1.25 of $1.00"
    sent = protocol.ErrorInfo(code="budget_exceeded", message=sentence, **named)
    events: list[protocol.AnyEvent] = [
        protocol.ResponseFailed(response_id=turn.id, error=sent),
        protocol.SessionStatus(status="failed", response_id=turn.id, error=sent),
    ]
    # As the server reads them off the tunnel.
    frames = [
        protocol.decode_runner_frame(
            protocol.encode(protocol.EventFrame(session_id=session_id, seq=seq, event=event))
        )
        for seq, event in enumerate(events, start=1)
    ]
    send(runner, session_id, *[(frame.seq, frame.event) for frame in frames])
    [event] = WebhookEvent.objects.filter(type="budget.exceeded")
    assert event.data == {
        "session_id": session_id,
        "response_id": turn.id,
        "status": "failed",
        **amounts,
        "error": {"code": "budget_exceeded", "message": sentence},
    }
    turn.refresh_from_db()
    assert turn.error == {"code": "budget_exceeded", "message": sentence}


# --- on PostgreSQL: the checks read the totals recorded calls leave ------------------------


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_recorded_calls_and_concurrent_raises_reach_the_checks(
    client_for, create_session, settings
) -> None:
    """Calls recorded by ``record_call`` (the upserts) are what the 429 reads; two
    writers raising one user's day at once lose no raise."""
    import threading

    from django.db import connection, connections, transaction

    from usage.models import Price

    if connection.vendor != "postgresql":
        pytest.skip("runs on PostgreSQL (make test-postgres)")
    settings.OMNIGENT_DAILY_BUDGET_USD = 0.002
    Price.objects.update_or_create(
        model="gpt-4o", defaults={"input_per_million": 1, "output_per_million": 0}
    )
    usage_services.prices.clear()
    session_id = create_session()
    alice = get_or_create_user(ALICE)
    for _ in range(2):
        with transaction.atomic():
            usage_services.record_call(
                session_id=session_id,
                response_id="resp_1",
                user_id=alice.pk,
                agent_name="file-helper",
                usage=usage_services.CallUsage(model="gpt-4o", input_tokens=1000),
            )
    response = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(response, 429, "budget_exceeded")

    start = threading.Barrier(4)
    failures: list[BaseException] = []

    def raise_day() -> None:
        try:
            start.wait()
            for _ in range(10):
                with transaction.atomic():
                    usage_services.raise_daily_budget(
                        user_id=alice.pk, day=EVENING.date(), by_nano=1000
                    )
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=raise_day) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not failures, failures
    assert UserBudgetRaise.objects.get(user_id=alice.pk).raised_nano == 40 * 1000
    line = budgets.budgets_for(Session.objects.get(pk=session_id)).user
    assert line == protocol.BudgetLine(scope="user", limit_nano=2_040_000, spent_nano=2_000_000)
    again = client_for(ALICE).post(f"/v1/sessions/{session_id}/events", MESSAGE, format="json")
    assert_error(again, 503, "runner_unavailable")


def test_a_session_without_budgets_costs_no_query_after_a_recorded_call(
    create_session, client_for, root, django_assert_num_queries
) -> None:
    """Asked after every run of recorded calls: nothing is read for a session without
    any budget once the process knows who has one; a user budget set here is seen."""
    session = Session.objects.select_related("agent").get(pk=create_session())
    assert budgets.has_budget(session) is False  # warms the bundle and the users' list
    with django_assert_num_queries(0):
        assert budgets.has_budget(session) is False
    put = client_for(ROOT).put(f"/v1/users/{ALICE}/budget", {"daily_usd": 1}, format="json")
    assert put.status_code == 200
    assert budgets.has_budget(session) is True


def test_the_admin_sets_and_removes_a_users_budget_audited(client, root) -> None:
    root.is_superuser = True
    root.save(update_fields=["is_superuser"])
    client.force_login(root)
    bob = get_or_create_user(BOB)
    assert client.get("/admin/usage/userbudget/").status_code == 200
    added = client.post(
        "/admin/usage/userbudget/add/", {"user": bob.pk, "daily_nano": 3 * NANO}, follow=True
    )
    assert added.status_code == 200
    assert UserBudget.objects.get(user=bob).daily_nano == 3 * NANO
    row = UserBudget.objects.get(user=bob)
    deleted = client.post(f"/admin/usage/userbudget/{row.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    assert not UserBudget.objects.exists()
    records = budget_records()
    assert [(r.actor, r.target_id) for r in records] == [(ROOT, BOB), (ROOT, BOB)]
    assert [r.details["new_daily_usd"] for r in records] == [3.0, None]


@pytest.mark.parametrize("own_usd", [None, 1.0])
def test_a_messages_budget_check_reads_the_agent_and_own_budget_with_the_session(
    client_for, create_session, root, own_usd
) -> None:
    """``POST …/events`` reads the session with its agent and its owner's own budget in
    one query: no statement of their own (a user's own budget still refuses)."""
    session_id = create_session()
    if own_usd is not None:
        put = client_for(ROOT).put(
            f"/v1/users/{ALICE}/budget", {"daily_usd": own_usd}, format="json"
        )
        assert put.status_code == 200
        spend_today(ALICE, own_usd)
    with CaptureQueriesContext(connection) as queries:
        response = client_for(ALICE).post(
            f"/v1/sessions/{session_id}/events", MESSAGE, format="json"
        )
    if own_usd is None:
        assert_error(response, 503, "runner_unavailable")  # past the check: no runner
    else:
        assert_error(response, 429, "budget_exceeded", mentions="daily budget")
    own_reads = [
        query["sql"]
        for query in queries
        if query["sql"].startswith("SELECT")
        and (
            'FROM "usage_userbudget"' in query["sql"]
            or 'FROM "agent_sessions_agent"' in query["sql"]
        )
    ]
    assert own_reads == []
