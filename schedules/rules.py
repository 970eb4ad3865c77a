"""Recurrence rules (RFC 5545 ``RRULE``) evaluated in an IANA time zone (automation.md).

A rule is expanded by python-dateutil in the zone's *wall time*: ``FREQ=DAILY;BYHOUR=2``
means 02:00 on the clock of ``timezone`` whatever its offset that day, and each local
time is then placed on the time line by ``zoneinfo`` (fold 0). So a time that does not
exist (the hour skipped when clocks go forward) runs that many minutes later, a time that
exists twice (clocks go back) runs once, at its first instant, and two local times that
land on the same instant run once.

The rule starts (``DTSTART``) at the task's creation, seconds set to 0, unless the text
names a ``DTSTART`` (floating, ``Z`` or ``TZID=…``; converted to the task's zone).

Costs. dateutil looks for the next occurrence period by period, up to the year 9999,
and checks ``UNTIL``/``COUNT`` only on occurrences it finds: a rule that never occurs
(``BYMONTH=2;BYMONTHDAY=30``) takes tens of seconds of CPU to say so. :func:`parse`
first probes the rule 400·k years later, close to 9999 (the Gregorian calendar repeats
every 400 years, days and weekdays alike), so such a rule is refused within a few
seconds at worst; and a task expands from its *anchor*, the last occurrence it reached
(``rebased``), not from its first ``DTSTART``, so the next occurrence of a years-old
five-minute rule is found in microseconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from dateutil.rrule import rrule, rrulestr

from omnigent_site.domain_errors import InvalidInput

MIN_INTERVAL = timedelta(minutes=5)
MAX_COUNT = 1000
# How many occurrences the minimum-interval check compares.
INTERVAL_CHECK = 300
_LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"
_DATE_TIME = re.compile(r"^(\d{8})T(\d{6})(Z?)$")
_YEARS_PER_CYCLE = 400
# Frequencies whose period grid a shift of 400 years keeps (whole days and weeks).
_SHIFTABLE = {"WEEKLY", "DAILY", "HOURLY", "MINUTELY"}


@dataclass(frozen=True, slots=True)
class Rule:
    """A parsed rule: the ``RRULE`` body, its zone, its start and where expansion starts."""

    body: str
    zone: ZoneInfo
    dtstart: datetime  # local wall time, naive
    anchor: datetime  # local wall time, naive: dtstart or a later occurrence

    @property
    def counted(self) -> bool:
        return "COUNT=" in self.body.upper()

    def _rrule(self, start: datetime) -> rrule:
        built = rrulestr(self.body, dtstart=start)
        assert isinstance(built, rrule)
        return built

    def occurrences(self) -> Iterator[tuple[datetime, datetime]]:
        """``(local wall time, UTC instant)`` from the anchor on, strictly increasing."""
        start = self.dtstart if self.counted else self.anchor
        last: datetime | None = None
        for local in self._rrule(start):
            instant = local.replace(tzinfo=self.zone).astimezone(UTC)
            if last is not None and instant <= last:
                continue
            last = instant
            yield local, instant

    def next_after(self, moment: datetime) -> datetime | None:
        """The first occurrence strictly after ``moment`` (UTC), or None."""
        for _, instant in self.occurrences():
            if instant > moment:
                return instant
        return None

    def upcoming(self, moment: datetime, count: int) -> list[datetime]:
        """The next ``count`` occurrences strictly after ``moment``."""
        found: list[datetime] = []
        for _, instant in self.occurrences():
            if instant > moment:
                found.append(instant)
                if len(found) == count:
                    break
        return found

    def latest_until(self, moment: datetime, *, after: datetime | None) -> datetime | None:
        """The last occurrence in ``(after, moment]``, or None."""
        latest = None
        for _, instant in self.occurrences():
            if instant > moment:
                break
            if after is None or instant > after:
                latest = instant
        return latest

    def rebased(self, instant: datetime) -> Rule:
        """The same rule expanding from the occurrence ``instant`` (an occurrence keeps the
        period grid and every default dtstart gives). Counted rules keep their start."""
        if self.counted:
            return self
        local = instant.astimezone(self.zone).replace(tzinfo=None)
        return replace(self, anchor=local) if local > self.anchor else self


def local_text(value: datetime) -> str:
    return value.strftime(_LOCAL_FORMAT)


def from_local_text(value: str) -> datetime:
    return datetime.strptime(value, _LOCAL_FORMAT)


def zone_named(name: object, *, field: str = "timezone") -> ZoneInfo:
    """The IANA zone ``name``; 400 naming ``field`` otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(
            "an IANA time zone name is required, such as 'Europe/Paris'", field=field
        )
    if name not in _zone_names():
        raise InvalidInput(f"unknown time zone {name!r}", field=field)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"unknown time zone {name!r}", field=field) from exc


_ZONES: set[str] = set()


def _zone_names() -> set[str]:
    if not _ZONES:
        _ZONES.update(available_timezones())
    return _ZONES


def restore(*, body: str, zone: str, dtstart: str, anchor: str) -> Rule:
    """A stored task's rule (already validated)."""
    return Rule(
        body=body,
        zone=ZoneInfo(zone),
        dtstart=from_local_text(dtstart),
        anchor=from_local_text(anchor or dtstart),
    )


def parse(*, text: object, zone: ZoneInfo, now: datetime, field: str = "rrule") -> Rule:
    """Validate ``text`` in ``zone``: 400 naming ``field`` for a bad rule, one that never
    occurs after ``now``, or one with two occurrences less than 5 minutes apart."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(
            "an RFC 5545 rule is required, such as 'FREQ=DAILY;BYHOUR=2'", field=field
        )
    if len(text) > 2000:
        raise InvalidInput("the rule is too long", field=field)
    body = ""
    dtstart: datetime | None = None
    for raw_line in text.strip().splitlines():
        line = raw_line.strip()
        if not line:
            continue
        upper = line.upper()
        if upper.startswith("DTSTART"):
            if dtstart is not None:
                raise InvalidInput("more than one DTSTART", field=field)
            dtstart = _parse_dtstart(line, zone=zone, field=field)
        elif upper.startswith("RRULE:") or upper.startswith("FREQ=") or "=" in upper.split(";")[0]:
            if body:
                raise InvalidInput("one RRULE line only", field=field)
            body = line[6:] if upper.startswith("RRULE:") else line
        else:
            raise InvalidInput(
                f"unsupported line {line[:40]!r}: use DTSTART and RRULE", field=field
            )
    if not body:
        raise InvalidInput("the rule has no RRULE part", field=field)
    body = _normalised_body(body, zone=zone, field=field)
    if dtstart is None:
        dtstart = now.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
    try:
        built = rrulestr(body, dtstart=dtstart)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise InvalidInput(f"not a valid RFC 5545 rule: {exc}", field=field) from exc
    if not isinstance(built, rrule):
        raise InvalidInput("not a single RFC 5545 rule", field=field)
    rule = Rule(body=body, zone=zone, dtstart=dtstart, anchor=dtstart)
    if not _occurs(rule):
        raise InvalidInput("the rule never occurs", field=field)
    _check_interval(rule, field=field)
    if rule.next_after(now) is None:
        raise InvalidInput("the rule has no occurrence after now", field=field)
    return rule


def _parse_dtstart(line: str, *, zone: ZoneInfo, field: str) -> datetime:
    head, _, value = line.partition(":")
    params = dict(part.split("=", 1) for part in head.split(";")[1:] if "=" in part)
    match = _DATE_TIME.match(value.strip())
    if match is None:
        raise InvalidInput("DTSTART must be a date-time such as 20260101T020000", field=field)
    try:
        naive = datetime.strptime(match.group(1) + match.group(2), "%Y%m%d%H%M%S")
    except ValueError as exc:
        raise InvalidInput(f"bad DTSTART: {exc}", field=field) from exc
    if match.group(3):
        return naive.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
    if "TZID" in {key.upper() for key in params}:
        tzid = next(value for key, value in params.items() if key.upper() == "TZID")
        source = zone_named(tzid, field=field)
        return naive.replace(tzinfo=source).astimezone(zone).replace(tzinfo=None)
    return naive


def _normalised_body(body: str, *, zone: ZoneInfo, field: str) -> str:
    """Upper-case keys; ``UNTIL`` in UTC becomes the zone's wall time; limits checked."""
    parts = []
    for part in body.split(";"):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput(f"bad rule part {part[:40]!r}", field=field)
        key = key.strip().upper()
        value = value.strip()
        if key == "FREQ" and value.upper() == "SECONDLY":
            raise InvalidInput("FREQ=SECONDLY is below the 5-minute minimum", field=field)
        if key == "COUNT":
            if not value.isdigit() or not 1 <= int(value) <= MAX_COUNT:
                raise InvalidInput(f"COUNT must be 1 to {MAX_COUNT}", field=field)
        if key == "UNTIL":
            match = _DATE_TIME.match(value)
            if match is None:
                raise InvalidInput(
                    "UNTIL must be a date-time such as 20271231T235900Z", field=field
                )
            if match.group(3):
                try:
                    until = datetime.strptime(match.group(1) + match.group(2), "%Y%m%d%H%M%S")
                except ValueError as exc:
                    raise InvalidInput(f"bad UNTIL: {exc}", field=field) from exc
                local = until.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
                value = local.strftime("%Y%m%dT%H%M%S")
        parts.append(f"{key}={value}")
    return ";".join(parts)


def _without(body: str, *keys: str) -> str:
    return ";".join(part for part in body.split(";") if part.split("=", 1)[0] not in keys)


def _occurs(rule: Rule) -> bool:
    """Whether the rule has any occurrence, probed close to the year 9999 when its period
    grid allows (see the module's note on costs)."""
    body = _without(rule.body, "COUNT", "UNTIL")
    freq = next(
        (part.split("=", 1)[1].upper() for part in body.split(";") if part.startswith("FREQ=")),
        "",
    )
    start = rule.dtstart
    if freq in _SHIFTABLE:
        cycles = (9999 - start.year) // _YEARS_PER_CYCLE
        if cycles > 0:
            start = start.replace(year=start.year + cycles * _YEARS_PER_CYCLE)
    try:
        probe = rrulestr(body, dtstart=start)
        return next(iter(probe), None) is not None
    except (ValueError, OverflowError):
        return False


def _check_interval(rule: Rule, *, field: str) -> None:
    previous: datetime | None = None
    for index, (_, instant) in enumerate(rule.occurrences()):
        if previous is not None and instant - previous < MIN_INTERVAL:
            raise InvalidInput(
                "two occurrences are less than 5 minutes apart "
                f"({previous.isoformat()} and {instant.isoformat()})",
                field=field,
            )
        previous = instant
        if index >= INTERVAL_CHECK:
            return
