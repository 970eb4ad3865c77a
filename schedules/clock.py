"""The firing loop's clock: the wall clock, replaceable in tests (``use``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

_now: Callable[[], datetime] = timezone.now


def now() -> datetime:
    return _now()


def use(source: Callable[[], datetime] | None) -> None:
    """Read time from ``source`` (a test's controllable clock); None restores the wall clock."""
    global _now
    _now = source or timezone.now
