"""Recording usage (docs/usage.md): each ``usage.recorded`` runner event, priced once,
adds to the turn, the session, and the user's day; the API and the stream show it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from omnigent_runner import protocol
from omnigent_site.users import get_or_create_user
from runners import runner_events
from runners.models import Runner
from sessions.models import Session, SessionEvent, Turn
from usage import selectors as usage_selectors
from usage import services as usage_services
from usage.models import DailyUsage, LlmCall, MonthlyUsage, Price, SessionUsage
from usage.shapes import session_usage_from_totals

from .conftest import ALICE, BOB

pytestmark = pytest.mark.django_db

USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def prices(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One known price, fresh in the process cache; a fixed clock."""
    Price.objects.all().delete()
    Price.objects.create(
        model="gpt-4o-mini",
        input_per_million=Decimal("0.15"),
        output_per_million=Decimal("0.60"),
        cache_read_per_million=Decimal("0.075"),
    )
    usage_services.prices.clear()
    monkeypatch.setattr(usage_services, "clock", lambda: NOON)
    yield
    usage_services.prices.clear()


def bound_session(client_for: Any, create_session: Any, owner: str = ALICE) -> tuple[str, Runner]:
    session_id = create_session(owner)
    now = timezone.now()
    runner = Runner.objects.create(
        id=f"runner_usage_{session_id[-6:]}",
        name="laptop",
        owner=get_or_create_user(owner),
        channel_name="specific.usage!x",
        connected_at=now,
        last_seen_at=now,
        generation=1,
    )
    response = client_for(owner).patch(
        f"/v1/sessions/{session_id}", {"runner_id": runner.id}, format="json"
    )
    assert response.status_code == 200, response.content
    return session_id, runner


def message(session_id: str, by: str = ALICE) -> Turn:
    _item, turn = runner_events.accept_message(
        session_id=session_id, created_by=by, data=USER_MESSAGE, tools=[]
    )
    return turn


def send(runner: Runner, session_id: str, *events: tuple[int, protocol.AnyEvent]) -> None:
    runner_events.record(runner_id=runner.id, session_id=session_id, events=list(events))


def used(
    turn: Turn, model: str = "gpt-4o-mini-2024-07-18", **counts: Any
) -> protocol.UsageRecorded:
    return protocol.UsageRecorded(response_id=turn.id, model=model, **counts)


# 1000 input (600 of them cached), 200 output of which 50 reasoning:
# 400 × 0.15 + 600 × 0.075 + 200 × 0.6 = 60 + 45 + 120 = 225 µUSD = 225,000 nano.
FIRST = {
    "input_tokens": 400,
    "cache_read_input_tokens": 600,
    "output_tokens": 200,
    "reasoning_tokens": 50,
}
FIRST_COST = 225_000
# 100 input, 10 output: 15 + 6 = 21 µUSD.
SECOND = {"input_tokens": 100, "output_tokens": 10}
SECOND_COST = 21_000


def test_calls_add_up_per_turn_session_and_day(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(
        runner,
        session_id,
        (1, protocol.ResponseCreated(response_id=turn.id)),
        (2, used(turn, **FIRST)),
        (3, used(turn, **SECOND)),
        (4, used(turn, model="mock-model", input_tokens=7, output_tokens=3)),  # unpriced
        (5, used(turn, reported=False)),
        (6, protocol.ResponseCompleted(response_id=turn.id)),
    )
    # A resent event (the runner did not see the ack) is not counted again.
    send(runner, session_id, (3, used(turn, **SECOND)))

    assert LlmCall.objects.count() == 4
    stored = Turn.objects.get(pk=turn.pk)
    alice = client_for(ALICE)
    body = alice.get(f"/v1/sessions/{session_id}/responses/{turn.id}").json()
    assert body["usage"] == {
        "model": "gpt-4o-mini-2024-07-18",  # the last call's model, as answered
        "llm_calls": 4,
        "input_tokens": 507,
        "output_tokens": 213,
        "total_tokens": 507 + 600 + 213,
        "cache_read_input_tokens": 600,
        "cache_creation_input_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 50},
        "cost_usd": (FIRST_COST + SECOND_COST) / 1e9,
    }
    assert stored.usage is not None

    snapshot = alice.get(f"/v1/sessions/{session_id}").json()
    usage = snapshot["usage"]
    assert usage["total_cost_usd"] == (FIRST_COST + SECOND_COST) / 1e9
    assert usage["llm_calls"] == 4
    assert usage["input_tokens"] == 507 and usage["output_tokens"] == 213
    assert set(usage["by_model"]) == {"gpt-4o-mini-2024-07-18", "mock-model"}
    assert "total_cost_usd" not in usage["by_model"]["mock-model"]  # unpriced: absent, not 0
    assert usage["by_model"]["mock-model"]["input_tokens"] == 7
    assert usage["by_model"]["gpt-4o-mini-2024-07-18"]["llm_calls"] == 3
    assert snapshot["total_cost_usd"] == (FIRST_COST + SECOND_COST) / 1e9

    (row,) = [r for r in alice.get("/v1/sessions").json()["data"] if r["id"] == session_id]
    assert row["total_cost_usd"] == (FIRST_COST + SECOND_COST) / 1e9

    user = get_or_create_user(ALICE)
    daily = {row.model: row for row in DailyUsage.objects.filter(user_id=user.pk)}
    assert daily["gpt-4o-mini-2024-07-18"].day == NOON.date()
    assert daily["gpt-4o-mini-2024-07-18"].cost_nano == FIRST_COST + SECOND_COST
    assert daily["gpt-4o-mini-2024-07-18"].llm_calls == 3
    assert daily["gpt-4o-mini-2024-07-18"].priced_calls == 2
    assert daily["mock-model"].priced_calls == 0
    monthly = MonthlyUsage.objects.get(user_id=user.pk, model="gpt-4o-mini-2024-07-18")
    assert monthly.month == NOON.date().replace(day=1)
    assert monthly.cost_nano == FIRST_COST + SECOND_COST and monthly.llm_calls == 3
    assert SessionUsage.objects.filter(session_id=session_id).count() == 2


def test_session_usage_is_stored_before_the_turn_ends(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(
        runner,
        session_id,
        (1, protocol.ResponseCreated(response_id=turn.id)),
        (2, used(turn, **SECOND)),
        (3, protocol.ResponseCompleted(response_id=turn.id)),
    )
    events = list(SessionEvent.objects.filter(session_id=session_id).order_by("seq"))
    types = [event.type for event in events]
    assert types.index("session.usage") + 1 == types.index("response.completed")
    usage_event = events[types.index("session.usage")].payload
    assert usage_event["session_id"] == session_id
    assert usage_event["usage"]["total_cost_usd"] == SECOND_COST / 1e9
    completed = events[types.index("response.completed")].payload
    assert completed["response"]["usage"]["cost_usd"] == SECOND_COST / 1e9
    assert completed["response"]["usage"]["llm_calls"] == 1


def test_a_turn_without_calls_has_no_usage_and_no_usage_event(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(
        runner,
        session_id,
        (1, protocol.ResponseCreated(response_id=turn.id)),
        (2, protocol.ResponseFailed(response_id=turn.id, error=protocol.ErrorInfo(code="x"))),
    )
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}/responses/{turn.id}").json()
    assert body["usage"] is None
    assert not SessionEvent.objects.filter(session_id=session_id, type="session.usage").exists()
    snapshot = client_for(ALICE).get(f"/v1/sessions/{session_id}").json()
    assert snapshot["usage"] is None and snapshot["total_cost_usd"] is None


def test_unreported_calls_count_as_calls_only(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(runner, session_id, (1, used(turn, reported=False, input_tokens=5)))
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}/responses/{turn.id}").json()
    assert body["usage"] == {"model": "gpt-4o-mini-2024-07-18", "llm_calls": 1}
    (call,) = LlmCall.objects.all()
    assert call.input_tokens == 0 and not call.reported and call.cost_nano is None


def test_a_later_price_change_does_not_rewrite_history(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(runner, session_id, (1, used(turn, **SECOND)))
    Price.objects.filter(model="gpt-4o-mini").update(input_per_million=Decimal("100"))
    usage_services.prices.clear()
    send(runner, session_id, (2, used(turn, model="other", input_tokens=1)))
    assert Session.objects.get(pk=session_id).total_cost_nano == SECOND_COST
    assert LlmCall.objects.get(model="gpt-4o-mini-2024-07-18").cost_nano == SECOND_COST


def test_usage_of_an_unknown_turn_is_skipped(client_for, create_session) -> None:
    session_id, runner = bound_session(client_for, create_session)
    send(runner, session_id, (1, protocol.UsageRecorded(response_id="resp_nope", model="x")))
    assert LlmCall.objects.count() == 0
    assert Session.objects.get(pk=session_id).last_runner_seq == 1


def test_each_user_is_counted_on_their_own_sessions(client_for, create_session) -> None:
    mine, runner = bound_session(client_for, create_session)
    theirs, other_runner = bound_session(client_for, create_session, owner=BOB)
    send(runner, mine, (1, used(message(mine), **SECOND)))
    send(other_runner, theirs, (1, used(message(theirs, by=BOB), **FIRST)))
    alice, bob = get_or_create_user(ALICE), get_or_create_user(BOB)
    assert DailyUsage.objects.get(user_id=alice.pk).cost_nano == SECOND_COST
    assert DailyUsage.objects.get(user_id=bob.pk).cost_nano == FIRST_COST


def test_a_turns_usage_is_written_with_its_end_or_at_the_runs_end(
    client_for, create_session
) -> None:
    """A turn that ends in the run of its calls gets its ``usage`` in the end's UPDATE
    (no UPDATE of its own); calls in a run without the end are written at that run's end."""
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(runner, session_id, (1, protocol.ResponseCreated(response_id=turn.id)))
    send(runner, session_id, (2, used(turn, **FIRST)))
    assert Turn.objects.get(pk=turn.pk).usage["cost_nano"] == FIRST_COST
    with CaptureQueriesContext(connection) as queries:
        send(
            runner,
            session_id,
            (3, used(turn, **SECOND)),
            (4, protocol.ResponseCompleted(response_id=turn.id)),
        )
    turn_updates = [
        query["sql"]
        for query in queries
        if query["sql"].startswith(f'UPDATE "{Turn._meta.db_table}"')
    ]
    assert len(turn_updates) == 1 and '"usage"' in turn_updates[0]
    stored = Turn.objects.get(pk=turn.pk)
    assert stored.status == Turn.Status.COMPLETED
    assert stored.usage["cost_nano"] == FIRST_COST + SECOND_COST


def test_the_sessions_row_sums_its_calls_as_its_usage_rows_do(client_for, create_session) -> None:
    """``Session.usage_totals`` (what the snapshot and ``session.usage`` show) equals the
    sums of the session's ``SessionUsage`` rows, across runs, models and days."""
    session_id, runner = bound_session(client_for, create_session)
    turn = message(session_id)
    send(
        runner,
        session_id,
        (1, protocol.ResponseCreated(response_id=turn.id)),
        (2, used(turn, **FIRST)),
        (3, used(turn, model="mock-model", input_tokens=7, output_tokens=3)),
    )
    send(runner, session_id, (4, used(turn, reported=False)), (5, used(turn, **SECOND)))
    send(runner, session_id, (6, protocol.ResponseCompleted(response_id=turn.id)))
    session = Session.objects.get(pk=session_id)
    expected = usage_selectors.session_usage(session_id=session_id)
    assert expected is not None and expected["llm_calls"] == 4
    assert session_usage_from_totals(session.usage_totals) == expected
    assert client_for(ALICE).get(f"/v1/sessions/{session_id}").json()["usage"] == expected
    shown = SessionEvent.objects.filter(session_id=session_id, type="session.usage").last()
    assert shown is not None and shown.payload["usage"] == expected


def test_the_migration_fills_the_sessions_totals_from_its_usage_rows(create_session) -> None:
    from django.apps import apps

    fill = importlib.import_module("sessions.migrations.0017_session_usage_totals").fill_totals
    session_id = create_session()
    for day, cost in ((date(2026, 3, 3), 5), (date(2026, 3, 4), 7)):
        SessionUsage.objects.create(
            session_id=session_id, day=day, model="m", input_tokens=2, llm_calls=1,
            priced_calls=1, cost_nano=cost,
        )  # fmt: skip
    SessionUsage.objects.create(session_id=session_id, day=date(2026, 3, 4), model="n", llm_calls=1)
    Session.objects.filter(pk=session_id).update(usage_totals=None)
    fill(apps, None)
    totals = Session.objects.get(pk=session_id).usage_totals
    assert session_usage_from_totals(totals) == usage_selectors.session_usage(session_id=session_id)
    assert totals["m"]["cost_nano"] == 12 and totals["n"]["llm_calls"] == 1
