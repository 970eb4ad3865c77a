"""RFC 5545 rules in IANA zones (schedules/rules.py): expansion, DST, the 5-minute
minimum, refusals naming the field, and bounded cost for rules that never occur."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from omnigent_site.domain_errors import InvalidInput
from schedules import rules

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
NEW_YORK = rules.zone_named("America/New_York")
PARIS = rules.zone_named("Europe/Paris")


def local(times: list[datetime], zone: rules.ZoneInfo) -> list[str]:
    return [t.astimezone(zone).strftime("%Y-%m-%d %H:%M %z") for t in times]


def test_daily_rule_in_a_zone_keeps_its_wall_time_across_spring_forward() -> None:
    rule = rules.parse(text="FREQ=DAILY;BYHOUR=2;BYMINUTE=30", zone=NEW_YORK, now=NOW)
    times = rule.upcoming(datetime(2026, 3, 6, tzinfo=UTC), 4)
    # 02:30 does not exist on 8 March: that run moves on by the hour skipped.
    assert local(times, NEW_YORK) == [
        "2026-03-06 02:30 -0500",
        "2026-03-07 02:30 -0500",
        "2026-03-08 03:30 -0400",
        "2026-03-09 02:30 -0400",
    ]


def test_a_time_that_happens_twice_when_clocks_go_back_runs_once() -> None:
    rule = rules.parse(text="FREQ=DAILY;BYHOUR=2;BYMINUTE=30", zone=PARIS, now=NOW)
    times = rule.upcoming(datetime(2026, 10, 24, tzinfo=UTC), 3)
    assert local(times, PARIS) == [
        "2026-10-24 02:30 +0200",
        "2026-10-25 02:30 +0200",
        "2026-10-26 02:30 +0100",
    ]
    assert len(set(times)) == 3


def test_hourly_rule_never_repeats_an_instant() -> None:
    rule = rules.parse(text="FREQ=HOURLY;BYMINUTE=0", zone=NEW_YORK, now=NOW)
    times = rule.upcoming(datetime(2026, 3, 8, 5, 30, tzinfo=UTC), 4)
    assert times == sorted(set(times))
    assert all((b - a).total_seconds() >= 3600 for a, b in zip(times, times[1:], strict=False))


def test_without_dtstart_the_rule_starts_at_creation_with_seconds_zeroed() -> None:
    rule = rules.parse(text="FREQ=MINUTELY;INTERVAL=10", zone=PARIS, now=NOW)
    assert rule.dtstart == datetime(2026, 3, 1, 13, 0, 0)  # 12:00:30 UTC in Paris, :00
    assert rule.next_after(NOW) == datetime(2026, 3, 1, 12, 10, tzinfo=UTC)


def test_dtstart_forms_are_read_in_the_tasks_zone() -> None:
    utc = rules.parse(text="DTSTART:20260101T010000Z\nRRULE:FREQ=DAILY", zone=PARIS, now=NOW)
    assert utc.dtstart == datetime(2026, 1, 1, 2, 0)
    tzid = rules.parse(
        text="DTSTART;TZID=America/New_York:20260101T020000\nRRULE:FREQ=DAILY", zone=PARIS, now=NOW
    )
    assert tzid.dtstart == datetime(2026, 1, 1, 8, 0)
    floating = rules.parse(text="DTSTART:20260101T020000\nRRULE:FREQ=WEEKLY", zone=PARIS, now=NOW)
    assert floating.dtstart == datetime(2026, 1, 1, 2, 0)
    assert rules.parse(text="RRULE:FREQ=DAILY;UNTIL=20300101T000000Z", zone=PARIS, now=NOW)


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ("FREQ=MINUTELY;INTERVAL=4", "5 minutes"),
        ("FREQ=SECONDLY", "5-minute"),
        ("FREQ=HOURLY;BYMINUTE=0,3", "5 minutes"),
        ("FREQ=DAILY;BYHOUR=0,23;BYMINUTE=0,58", "5 minutes"),
        ("FREQ=DAILY;COUNT=5000", "COUNT"),
        ("not a rule", "unsupported"),
        ("FREQ=FORTNIGHTLY", "not a valid"),
        ("DTSTART:20200101T000000Z\nRRULE:FREQ=DAILY;COUNT=3", "no occurrence after now"),
        ("", "required"),
    ],
)
def test_bad_rules_are_400_naming_the_field(text: str, mentions: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        rules.parse(text=text, zone=PARIS, now=NOW)
    assert raised.value.field == "rrule"
    assert mentions.lower() in raised.value.message.lower()


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", 5])
def test_unknown_zones_are_400_naming_timezone(name: object) -> None:
    with pytest.raises(InvalidInput) as raised:
        rules.zone_named(name)
    assert raised.value.field == "timezone"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text", ["FREQ=WEEKLY;BYMONTH=2;BYMONTHDAY=30", "FREQ=DAILY;INTERVAL=7;BYDAY=TU"]
)
def test_a_rule_that_never_occurs_is_refused_in_bounded_time(text: str) -> None:
    # Dateutil alone takes 30-50 s of CPU to find that out (rules.py, Costs).
    started = time.monotonic()
    with pytest.raises(InvalidInput, match="never occurs"):
        rules.parse(text=text, zone=PARIS, now=datetime(2026, 3, 2, 9, tzinfo=UTC))
    assert time.monotonic() - started < 10


def test_rebasing_keeps_the_occurrences_and_makes_expansion_cheap() -> None:
    rule = rules.parse(
        text="DTSTART:20260101T000300\nRRULE:FREQ=MINUTELY;INTERVAL=15", zone=PARIS, now=NOW
    )
    later = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    expected = rule.upcoming(later, 5)
    occurrence = rule.latest_until(later, after=None)
    assert occurrence is not None
    rebased = rule.rebased(occurrence)
    assert rebased.anchor > rule.anchor
    started = time.monotonic()
    assert rebased.upcoming(later, 5) == expected
    assert time.monotonic() - started < 0.05
    assert [t.minute % 15 for t in expected] == [3] * 5
