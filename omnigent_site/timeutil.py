"""The API speaks integer Unix seconds."""

from __future__ import annotations

from datetime import datetime


def unix(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None
