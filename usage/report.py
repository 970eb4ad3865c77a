"""The shapes of ``GET /v1/usage`` (docs/usage.md, Reports), the reference's field names."""

from __future__ import annotations

from typing import Literal

from typing_extensions import TypedDict


class DailyCostOut(TypedDict):
    day: str
    cost_usd: float


class SessionCostOut(TypedDict):
    id: str
    title: str | None
    created_at: int
    updated_at: int
    cost_usd: float
    models: dict[str, float]
    agent_name: str


class UsageReportOut(TypedDict):
    """The caller's (or, for staff, ``?user=``'s) cost: today, the last 7 and 30 UTC days,
    in the range (all time without one), per day, and per session (most recent first)."""

    object: Literal["usage_report"]
    cost_today: float
    cost_last_7d: float
    cost_last_30d: float
    total_cost_usd: float
    daily_costs: list[DailyCostOut]
    sessions: list[SessionCostOut]


class UsageGroupOut(TypedDict):
    key: str
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None


class UsageGroupsOut(TypedDict):
    """``?group_by=``: one row per model, agent, UTC day, session or user (staff)."""

    object: Literal["list"]
    data: list[UsageGroupOut]
