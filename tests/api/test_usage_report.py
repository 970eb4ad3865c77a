"""``GET /v1/usage`` (docs/usage.md, Reports): the report, groups, ranges, staff-only
views, and validation in the error format."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from omnigent_site.users import get_or_create_user
from sessions.models import Session
from usage import services as usage_services
from usage.models import DailyUsage, MonthlyUsage, SessionUsage
from usage.selectors import split_range
from usage.services import SUM_FIELDS

from .conftest import ALICE, BOB, assert_error

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 31, 18, 0, tzinfo=UTC)
TODAY = NOW.date()
ROOT = "root@example.com"


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(usage_services, "clock", lambda: NOW)
    yield


def spend(
    user: str,
    *,
    day: date,
    model: str,
    cost_nano: int | None,
    session_id: str = "conv_x",
    agent: str = "helper",
    tokens: int = 100,
) -> None:
    """What recording calls leaves in the totals (the recording has its own tests)."""
    user_pk = get_or_create_user(user).pk
    common: dict[str, Any] = {
        "day": day,
        "model": model,
        "agent_name": agent,
        "input_tokens": tokens,
        "output_tokens": tokens // 10,
        "cache_read_input_tokens": tokens // 2,
        "llm_calls": 1,
        "priced_calls": 0 if cost_nano is None else 1,
        "cost_nano": cost_nano or 0,
    }
    DailyUsage.objects.create(user_id=user_pk, **common)
    SessionUsage.objects.create(session_id=session_id, user_id=user_pk, **common)
    month, _ = MonthlyUsage.objects.get_or_create(
        user_id=user_pk, month=day.replace(day=1), model=model, agent_name=agent
    )
    for name in SUM_FIELDS:
        setattr(month, name, getattr(month, name) + common.get(name, 0))
    month.save()


def test_the_report_of_the_callers_own_sessions(client_for, create_session) -> None:
    session_id = create_session(ALICE, title="Spend")
    spend(ALICE, day=TODAY, model="gpt-4o", cost_nano=1_500_000_000, session_id=session_id)
    spend(
        ALICE,
        day=TODAY - timedelta(days=3),
        model="gpt-4o-mini",
        cost_nano=250_000_000,
        session_id=session_id,
    )
    spend(ALICE, day=TODAY - timedelta(days=20), model="gpt-4o", cost_nano=1_000_000_000)
    spend(ALICE, day=TODAY - timedelta(days=40), model="gpt-4o", cost_nano=7_000_000_000)
    spend(BOB, day=TODAY, model="gpt-4o", cost_nano=9_000_000_000, session_id="conv_b")

    body = client_for(ALICE).get("/v1/usage").json()
    assert body["object"] == "usage_report"
    assert body["cost_today"] == 1.5
    assert body["cost_last_7d"] == 1.75
    assert body["cost_last_30d"] == 2.75
    assert body["total_cost_usd"] == 9.75
    days = body["daily_costs"]
    assert len(days) == 30 and days[-1] == {"day": TODAY.isoformat(), "cost_usd": 1.5}
    assert days[0]["day"] == (TODAY - timedelta(days=29)).isoformat()
    assert days[-4] == {"day": (TODAY - timedelta(days=3)).isoformat(), "cost_usd": 0.25}
    (row,) = body["sessions"]  # conv_x is no session of hers any more: left out
    assert row["id"] == session_id and row["title"] == "Spend"
    assert row["cost_usd"] == 1.75
    assert row["models"] == {"gpt-4o": 1.5, "gpt-4o-mini": 0.25}
    assert row["agent_name"] == Session.objects.get(pk=session_id).agent.name
    assert isinstance(row["created_at"], int) and isinstance(row["updated_at"], int)


def test_a_range_bounds_the_days_and_the_total(client_for) -> None:
    spend(ALICE, day=date(2026, 1, 10), model="gpt-4o", cost_nano=1_000_000_000)
    spend(ALICE, day=date(2026, 1, 12), model="gpt-4o", cost_nano=2_000_000_000)
    spend(ALICE, day=date(2026, 1, 14), model="gpt-4o", cost_nano=4_000_000_000)
    body = client_for(ALICE).get("/v1/usage?since=2026-01-11&until=2026-01-14").json()
    assert body["total_cost_usd"] == 6.0
    assert [d["day"] for d in body["daily_costs"]] == [
        "2026-01-11",
        "2026-01-12",
        "2026-01-13",
        "2026-01-14",
    ]
    assert [d["cost_usd"] for d in body["daily_costs"]] == [0.0, 2.0, 0.0, 4.0]


def test_groups_sum_tokens_and_leave_unpriced_cost_absent(client_for) -> None:
    spend(ALICE, day=TODAY, model="gpt-4o", cost_nano=1_000_000_000, agent="a", tokens=100)
    spend(
        ALICE,
        day=TODAY - timedelta(days=1),
        model="gpt-4o",
        cost_nano=2_000_000_000,
        agent="b",
        tokens=200,
    )
    spend(ALICE, day=TODAY, model="mock-model", cost_nano=None, agent="a", tokens=10)
    alice = client_for(ALICE)
    by_model = alice.get("/v1/usage?group_by=model").json()
    assert by_model["object"] == "list"
    assert by_model["data"] == [
        {
            "key": "gpt-4o",
            "input_tokens": 300,
            "output_tokens": 30,
            "total_tokens": 300 + 150 + 30,
            "cost_usd": 3.0,
        },
        {
            "key": "mock-model",
            "input_tokens": 10,
            "output_tokens": 1,
            "total_tokens": 10 + 5 + 1,
            "cost_usd": None,
        },
    ]
    by_agent = alice.get("/v1/usage?group_by=agent").json()["data"]
    assert [(row["key"], row["cost_usd"]) for row in by_agent] == [("a", 1.0), ("b", 2.0)]
    by_day = alice.get(f"/v1/usage?group_by=day&since={TODAY.isoformat()}").json()["data"]
    assert [(row["key"], row["input_tokens"]) for row in by_day] == [(TODAY.isoformat(), 110)]
    by_session = alice.get("/v1/usage?group_by=session").json()["data"]
    assert [row["key"] for row in by_session] == ["conv_x"]


def test_other_users_are_for_staff_only(client_for) -> None:
    spend(ALICE, day=TODAY, model="gpt-4o", cost_nano=1_000_000_000)
    spend(BOB, day=TODAY, model="gpt-4o", cost_nano=2_000_000_000, session_id="conv_b")
    bob = client_for(BOB)
    assert_error(bob.get(f"/v1/usage?user={ALICE}"), 403, "forbidden")
    assert_error(bob.get("/v1/usage?group_by=user"), 403, "forbidden")
    get_user_model().objects.create_user(username=ROOT, is_staff=True)
    root = client_for(ROOT)
    assert root.get(f"/v1/usage?user={ALICE}").json()["total_cost_usd"] == 1.0
    users = root.get("/v1/usage?group_by=user").json()["data"]
    assert sorted((row["key"], row["cost_usd"]) for row in users) == [(ALICE, 1.0), (BOB, 2.0)]
    only_bob = root.get(f"/v1/usage?group_by=model&user={BOB}").json()["data"]
    assert [row["cost_usd"] for row in only_bob] == [2.0]
    assert_error(root.get("/v1/usage?user=nobody@example.com"), 400, "invalid_input")


@pytest.mark.parametrize(
    "query",
    [
        "group_by=week",
        "since=yesterday",
        "until=2026-02-30",
        "since=2026-03-02&until=2026-03-01",
        "since=1990-01-01&until=2026-01-01",
        "since=1990-01-01",
    ],
)
def test_bad_queries_are_400_in_the_error_format(client_for, query: str) -> None:
    assert_error(client_for(ALICE).get(f"/v1/usage?{query}"), 400, "invalid_input")


def test_it_needs_a_signed_in_user(client_for) -> None:
    response = client_for(None).get("/v1/usage")
    assert response.status_code in (401, 403)


def test_a_year_of_ten_models_is_read_in_few_queries(client_for, django_assert_max_num_queries):
    for n in range(365):
        for m in range(3):
            spend(ALICE, day=TODAY - timedelta(days=n), model=f"m{m}", cost_nano=1000)
    alice = client_for(ALICE)
    with django_assert_max_num_queries(12):
        body = alice.get("/v1/usage?since=" + (TODAY - timedelta(days=364)).isoformat()).json()
    assert len(body["daily_costs"]) == 365
    assert body["total_cost_usd"] == 365 * 3 * 1000 / 1e9


@pytest.mark.parametrize(
    ("since", "until", "days", "months"),
    [
        # Whole months only.
        ("2026-01-01", "2026-03-31", [], ("2026-01-01", "2026-03-01")),
        # Edges inside months: their days, the months between.
        (
            "2026-01-15",
            "2026-04-10",
            [("2026-01-15", "2026-01-31"), ("2026-04-01", "2026-04-10")],
            ("2026-02-01", "2026-03-01"),
        ),
        # Within one month: days only.
        ("2026-02-03", "2026-02-20", [("2026-02-03", "2026-02-20")], None),
        # Open ends.
        (None, None, [], (None, None)),
        ("2026-01-15", None, [("2026-01-15", "2026-01-31")], ("2026-02-01", None)),
        (None, "2026-02-27", [("2026-02-01", "2026-02-27")], (None, "2026-01-01")),
        (None, "2028-02-29", [], (None, "2028-02-01")),
    ],
)
def test_a_range_is_whole_months_and_edge_days(since, until, days, months) -> None:
    def parse(value: str | None) -> date | None:
        return date.fromisoformat(value) if value else None

    got_days, got_months = split_range(parse(since), parse(until))
    assert got_days == [(parse(a), parse(b)) for a, b in days]
    assert got_months == (None if months is None else (parse(months[0]), parse(months[1])))


def test_groups_over_months_and_edge_days_count_each_day_once(client_for) -> None:
    for offset in range(0, 120, 3):
        spend(
            ALICE,
            day=date(2026, 1, 1) + timedelta(days=offset),
            model="gpt-4o",
            cost_nano=1_000_000_000,
        )
    for since, until in (
        ("2026-01-10", "2026-04-20"),
        ("2026-02-01", "2026-02-28"),
        ("2026-01-01", "2026-04-30"),
        ("2026-03-05", "2026-03-05"),
    ):
        first, last = date.fromisoformat(since), date.fromisoformat(until)
        expected = sum(
            1
            for offset in range(0, 120, 3)
            if first <= date(2026, 1, 1) + timedelta(days=offset) <= last
        )
        query = f"since={since}&until={until}"
        by_model = client_for(ALICE).get(f"/v1/usage?group_by=model&{query}").json()["data"]
        assert [row["cost_usd"] for row in by_model] == ([float(expected)] if expected else [])
        report = client_for(ALICE).get(f"/v1/usage?{query}").json()
        assert report["total_cost_usd"] == float(expected)
