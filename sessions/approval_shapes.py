"""The JSON shapes of approvals and policies (approvals.md).

The question event and the answer endpoints are **compat** shapes: Omnigent's SDK reads
``response.elicitation_request`` with its ``on_elicitation_request`` hook and drops a
payload that lacks a required field, so every field listed here is always present.
Typed dicts rendered by plain functions and documented from the same classes, like
``sessions/shapes.py``; no DRF here (the runner-event code renders these too). The
question event is here because the snapshot lists open questions in its shape; the
other approval events are with the rest of the session stream's (``stream_events.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, NotRequired, cast

from typing_extensions import Doc, TypedDict

from omnigent_runner.budgets import usd_text
from omnigent_runner.policies import MAX_BUDGET_USD, usd_as_nano
from omnigent_runner.protocol import PolicyRule
from omnigent_site.shapes import CursorPage, ObjectList
from omnigent_site.timeutil import unix

from .models import Approval

# As in ``sessions/shapes.py``, which imports this module (the snapshot lists open questions).
UnixTime = Annotated[int, Doc("Unix seconds")]
OptionalUnixTime = Annotated[int | None, Doc("Unix seconds")]

PREVIEW_CHARS = 1024
# How much of the argument a question's sentence quotes.
SUMMARY_CHARS = 200
# The argument a question quotes when the call has it (sys_os_shell, the file tools).
SUMMARY_ARGUMENTS = ("command", "path", "file_path", "url", "query")

VerdictAction = Literal["accept", "decline", "cancel"]


# --- what a person is asked -------------------------------------------------------------


def arguments_json(arguments: dict[str, Any]) -> str:
    """Keys sorted: the arguments come back from PostgreSQL's ``jsonb`` in its own key
    order, so the stream's event and a later snapshot show the same text only if the
    order is the text's own."""
    return json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "), sort_keys=True)


def content_preview(arguments: dict[str, Any]) -> str:
    """The call's arguments as JSON, cut to 1,024 characters."""
    return arguments_json(arguments)[:PREVIEW_CHARS]


def approval_message(tool: str, arguments: dict[str, Any]) -> str:
    """The question as a sentence: "Agent wants to run sys_os_shell: `rm -rf build`. Approve?"

    It quotes the argument that says what the call does (a shell command, a path),
    else the only argument, else all of them as JSON, on one line and cut short.
    """
    chosen = next(
        (arguments[key] for key in SUMMARY_ARGUMENTS if isinstance(arguments.get(key), str)),
        None,
    )
    if chosen is None and len(arguments) == 1:
        only = next(iter(arguments.values()))
        chosen = only if isinstance(only, str) else None
    summary = chosen if chosen is not None else arguments_json(arguments)
    summary = " ".join(summary.split()).replace("`", "'")
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 1] + "…"
    if not summary or summary == "{}":
        return f"Agent wants to run {tool}. Approve?"
    return f"Agent wants to run {tool}: `{summary}`. Approve?"


BUDGET_POLICY = "budget"
BUDGET_KEYS = ("kind", "scope", "budget_usd", "spent_usd", "increment_usd")


def budget_params(approval: Approval) -> dict[str, Any] | None:
    """A budget question's ``params`` (usage.md, Budgets: ``{kind: "budget", scope,
    budget_usd, spent_usd, increment_usd}``, which the runner sends as the question's
    arguments under ``policy_name: "budget"``); None for any other question."""
    if (
        approval.policy_name != BUDGET_POLICY
        or approval.tool != ""
        or approval.requested_schema is not None
    ):
        return None
    params = approval.arguments
    if not isinstance(params, dict) or params.get("kind") != "budget":
        return None
    return {key: params[key] for key in BUDGET_KEYS if key in params}


def _dollars(value: Any) -> str:
    """An amount the runner sent, exact to the nano-dollar; "?" for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "?"
    if not (math.isfinite(value) and 0 <= value <= MAX_BUDGET_USD * 1000):
        return "?"
    return usd_text(usd_as_nano(value))


def budget_message(params: dict[str, Any]) -> str:
    """The sentence a budget question shows."""
    whose = "the daily budget" if params.get("scope") == "user" else "the session's budget"
    return (
        f"Budget reached: spent {_dollars(params.get('spent_usd'))} of "
        f"{_dollars(params.get('budget_usd'))} ({whose}) — allow "
        f"{_dollars(params.get('increment_usd'))} more?"
    )


# --- stream events ----------------------------------------------------------------------


class ElicitationParams(TypedDict):
    """``params`` of an elicitation request (MCP's ``elicitation/create``, form mode)."""

    mode: Literal["form"]
    message: Annotated[str, Doc("the question as a sentence")]
    requestedSchema: Annotated[
        dict[str, Any],
        Doc("{} for a rule's question (the answer is the action); an MCP server's schema"),
    ]
    phase: Annotated[
        Literal["tool_call", "budget"],
        Doc("`budget`: a budget is spent and the next LLM call waits (usage.md)"),
    ]
    policy_name: Annotated[str | None, Doc("the rule that asked; null for an MCP server")]
    content_preview: Annotated[
        str,
        Doc("the call's arguments as JSON, cut to 1,024 chars; an MCP server's message"),
    ]
    kind: NotRequired[Annotated[Literal["budget"], Doc("budget questions only")]]
    scope: NotRequired[Annotated[Literal["session", "user"], Doc("budget questions only")]]
    budget_usd: NotRequired[Annotated[float, Doc("budget questions: the budget reached")]]
    spent_usd: NotRequired[Annotated[float, Doc("budget questions: spent against it")]]
    increment_usd: NotRequired[Annotated[float, Doc("budget questions: what accept adds")]]


class ElicitationRequestEvent(TypedDict):
    """``response.elicitation_request``: a tool call waits for a person's verdict.
    Also the entries of the snapshot's ``pending_elicitations``."""

    type: Literal["response.elicitation_request"]
    elicitation_id: str
    session_id: str
    response_id: str
    method: Literal["elicitation/create"]
    params: ElicitationParams


def elicitation_request_event(approval: Approval) -> ElicitationRequestEvent:
    params: ElicitationParams = {
        "mode": "form",
        "message": approval.message,
        "requestedSchema": approval.requested_schema or {},
        "phase": "tool_call",
        "policy_name": None if approval.requested_schema is not None else approval.policy_name,
        "content_preview": approval.message[:PREVIEW_CHARS]
        if approval.requested_schema is not None
        else content_preview(approval.arguments),
    }
    budget = budget_params(approval)
    if budget is not None:
        params["phase"] = "budget"
        params.update(budget)  # type: ignore[typeddict-item]
    return {
        "type": "response.elicitation_request",
        "elicitation_id": approval.id,
        "session_id": approval.session_id,
        "response_id": approval.response_id,
        "method": "elicitation/create",
        "params": params,
    }


def pending_elicitations(approvals: Iterable[Approval]) -> list[ElicitationRequestEvent]:
    return [elicitation_request_event(approval) for approval in approvals]


# --- endpoints --------------------------------------------------------------------------


class ElicitationOut(TypedDict):
    """An approval: the question about one tool call and its verdict."""

    id: str
    object: Literal["session.elicitation"]
    status: Annotated[str, Approval.Status]
    tool: str
    arguments: Annotated[dict[str, Any], Doc("the call's arguments, as shown to the person")]
    policy_name: Annotated[str | None, Doc("the rule that asked; null for an MCP server")]
    message: str
    response_id: str
    call_id: str
    created_at: UnixTime
    expires_at: UnixTime
    resolved_at: OptionalUnixTime
    resolved_by: Annotated[str | None, Doc("who gave the verdict; null for expiry")]
    reason: Annotated[str | None, Doc("the verdict's reason")]


def elicitation_body(approval: Approval) -> ElicitationOut:
    """``approval.resolved_by`` must be loaded with the row (``select_related``)."""
    user = approval.resolved_by
    return {
        "id": approval.id,
        "object": "session.elicitation",
        "status": approval.status,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "policy_name": None if approval.requested_schema is not None else approval.policy_name,
        "message": approval.message,
        "response_id": approval.response_id,
        "call_id": approval.call_id,
        "created_at": int(approval.created_at.timestamp()),
        "expires_at": int(approval.expires_at.timestamp()),
        "resolved_at": unix(approval.resolved_at),
        "resolved_by": user.get_username() if user is not None else None,
        "reason": approval.reason,
    }


class ElicitationPage(CursorPage[ElicitationOut]):
    """A page of a session's approvals."""


class ElicitationResolveOut(TypedDict):
    """The 202 of an answer: the verdict is stored (and relayed when the runner is online)."""

    queued: bool


def elicitation_resolve_body() -> ElicitationResolveOut:
    return {"queued": False}


class PolicyRuleOut(TypedDict):
    """A policy rule of the effective list, with where it comes from. An ``ask`` rule
    shows the timeout that applies (its own, else the bundle's, else the default,
    capped by the server)."""

    name: str
    tools: Annotated[list[str], Doc("shell-style globs on the tool name")]
    action: Literal["allow", "deny", "ask"]
    when: NotRequired[Annotated[dict[str, str], Doc("argument name -> regex")]]
    reason: NotRequired[str]
    ask_timeout: NotRequired[Annotated[float, Doc("seconds")]]
    source: Literal["session", "bundle"]


class PolicyList(ObjectList[PolicyRuleOut]):
    """The effective rules in evaluation order: the session's, then the bundle's."""


def policy_list_body(rules: Sequence[PolicyRule], *, session_rule_count: int) -> PolicyList:
    data: list[PolicyRuleOut] = []
    for index, rule in enumerate(rules):
        row: dict[str, Any] = {"name": rule.name, "tools": list(rule.tools), "action": rule.action}
        if rule.when is not None:
            row["when"] = dict(rule.when)
        if rule.reason is not None:
            row["reason"] = rule.reason
        if rule.ask_timeout is not None:
            row["ask_timeout"] = rule.ask_timeout
        row["source"] = "session" if index < session_rule_count else "bundle"
        data.append(cast(PolicyRuleOut, row))
    return {"object": "list", "data": data}
