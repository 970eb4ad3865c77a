"""The usage objects of the HTTP API and the stream (docs/usage.md), field names as the
reference names them (``compat``): per turn, per session, and the report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NotRequired

from typing_extensions import TypedDict

from .pricing import NANO
from .services import SUM_FIELDS, TOKEN_FIELDS, CallUsage


def usd(cost_nano: int) -> float:
    """Nano-dollars as the API's USD number."""
    return round(cost_nano / NANO, 9)


class ReasoningOut(TypedDict):
    reasoning_tokens: int


class TokensOut(TypedDict):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens_details: ReasoningOut


class TurnUsageOut(TypedDict):
    """A turn's usage; without token fields when none of its calls reported any."""

    model: str
    llm_calls: int
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    total_tokens: NotRequired[int]
    cache_read_input_tokens: NotRequired[int]
    cache_creation_input_tokens: NotRequired[int]
    output_tokens_details: NotRequired[ReasoningOut]
    cost_usd: NotRequired[float]


class ModelUsageOut(TokensOut):
    llm_calls: int
    total_cost_usd: NotRequired[float]


class SessionUsageOut(ModelUsageOut):
    by_model: dict[str, ModelUsageOut]


def tokens_body(sums: Mapping[str, Any]) -> TokensOut:
    counts = {name: int(sums.get(name) or 0) for name in TOKEN_FIELDS}
    return {
        "input_tokens": counts["input_tokens"],
        "output_tokens": counts["output_tokens"],
        "total_tokens": counts["input_tokens"]
        + counts["cache_read_input_tokens"]
        + counts["cache_creation_input_tokens"]
        + counts["output_tokens"],
        "cache_read_input_tokens": counts["cache_read_input_tokens"],
        "cache_creation_input_tokens": counts["cache_creation_input_tokens"],
        "output_tokens_details": {"reasoning_tokens": counts["reasoning_tokens"]},
    }


# --- per turn: kept on the turn's row (``Turn.usage``) as these sums ---------------------


def add_to_turn(stored: Mapping[str, Any] | None, usage: CallUsage, cost_nano: int | None):
    """The turn's stored sums with one more call added (a new dict)."""
    sums: dict[str, Any] = dict(stored or {})
    sums["llm_calls"] = int(sums.get("llm_calls") or 0) + 1
    if usage.model:
        sums["model"] = usage.model  # the latest call's model, as the provider named it
    if usage.reported:
        sums["reported_calls"] = int(sums.get("reported_calls") or 0) + 1
        for name in TOKEN_FIELDS:
            sums[name] = int(sums.get(name) or 0) + getattr(usage, name)
    if cost_nano is not None:
        sums["priced_calls"] = int(sums.get("priced_calls") or 0) + 1
        sums["cost_nano"] = int(sums.get("cost_nano") or 0) + cost_nano
    return sums


def turn_usage_body(stored: Mapping[str, Any] | None) -> TurnUsageOut | None:
    """A turn's ``usage``; None before its first call. Its ``model`` is the latest
    call's, as the provider answered (else as requested)."""
    if not stored:
        return None
    body: dict[str, Any] = {"model": str(stored.get("model") or "")}
    body["llm_calls"] = int(stored.get("llm_calls") or 0)
    if stored.get("reported_calls"):
        body.update(tokens_body(stored))
    if stored.get("priced_calls"):
        body["cost_usd"] = usd(int(stored.get("cost_nano") or 0))
    return body  # type: ignore[return-value]


# --- per session: summed from its ``SessionUsage`` rows ----------------------------------


def model_usage_body(sums: Mapping[str, Any]) -> ModelUsageOut:
    body: dict[str, Any] = {**tokens_body(sums), "llm_calls": int(sums.get("llm_calls") or 0)}
    if sums.get("priced_calls"):
        body["total_cost_usd"] = usd(int(sums.get("cost_nano") or 0))
    return body  # type: ignore[return-value]


def add_to_session_totals(
    stored: Mapping[str, Any] | None, usage: CallUsage, cost_nano: int | None
) -> dict[str, dict[str, int]]:
    """A session's sums by model (``Session.usage_totals``) with one more call added (a
    new dict), counted as ``usage.services.record_calls`` counts it in the totals rows."""
    totals: dict[str, dict[str, int]] = {
        model: dict(sums) for model, sums in (stored or {}).items()
    }
    sums = totals.setdefault(usage.model, dict.fromkeys(SUM_FIELDS, 0))
    if usage.reported:
        for name in TOKEN_FIELDS:
            sums[name] = int(sums.get(name) or 0) + int(getattr(usage, name))
    sums["llm_calls"] = int(sums.get("llm_calls") or 0) + 1
    if cost_nano is not None:
        sums["priced_calls"] = int(sums.get("priced_calls") or 0) + 1
        sums["cost_nano"] = int(sums.get("cost_nano") or 0) + cost_nano
    return totals


def session_usage_from_totals(stored: Mapping[str, Any] | None) -> SessionUsageOut | None:
    """The session's ``usage`` from ``Session.usage_totals``; None before its first call."""
    if not stored:
        return None
    return session_usage_body(sorted(stored.items()))


def session_usage_body(by_model: Iterable[tuple[str, Mapping[str, Any]]]) -> SessionUsageOut:
    """The session's ``usage``: every model's sums, and their total."""
    total: dict[str, int] = {}
    models: dict[str, ModelUsageOut] = {}
    for model, sums in by_model:
        models[model] = model_usage_body(sums)
        for name in SUM_FIELDS:
            total[name] = total.get(name, 0) + int(sums.get(name) or 0)
    return {**model_usage_body(total), "by_model": models}  # type: ignore[typeddict-item]


class UserBudgetOut(TypedDict):
    """``GET|PUT /v1/users/{id}/budget`` (usage.md, Budgets)."""

    object: str
    user_id: str
    daily_usd: float | None
    default_daily_usd: float | None
    effective_daily_usd: float | None
    raised_today_usd: float
    spent_today_usd: float


def user_budget_body(
    *,
    username: str,
    own_nano: int | None,
    default_nano: int | None,
    raised_nano: int,
    spent_nano: int,
) -> UserBudgetOut:
    """``daily_usd``: the user's own budget (null: none, the default applies);
    ``effective_daily_usd``: what applies today, raises included (null: no budget)."""
    base = own_nano if own_nano is not None else default_nano
    return {
        "object": "user_budget",
        "user_id": username,
        "daily_usd": None if own_nano is None else usd(own_nano),
        "default_daily_usd": None if default_nano is None else usd(default_nano),
        "effective_daily_usd": None if base is None else usd(base + raised_nano),
        "raised_today_usd": usd(raised_nano),
        "spent_today_usd": usd(spent_nano),
    }
