"""Policy rules for tool calls (approvals.md): validating them and deciding a call.

Rules are declarative data, never code: a rule names tool globs, optional argument
regexes and an action, so neither a bundle nor an API call can make the server or the
runner import or run anything. The server validates rules with :func:`parse_rules` /
:func:`parse_guardrails` and sends the *effective* list (:func:`effective_rules`) to the
runner, which only calls :func:`decide` before each tool call. Both ends use this one
module, so what the server accepts is exactly what the runner evaluates. Django-free,
because the runner imports it.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal, TypeAlias

import msgspec

from omnigent_runner.protocol import PolicyRule

Action: TypeAlias = Literal["allow", "deny", "ask"]
ACTIONS: tuple[Action, ...] = ("allow", "deny", "ask")
RULE_KEYS = frozenset({"name", "tools", "when", "action", "reason", "ask_timeout"})
GUARDRAILS_KEYS = frozenset(
    {
        "ask_on_os_tools",
        "ask_on_mcp_tools",
        "ask_timeout",
        "policies",
        "budget_usd",
        "on_budget",
        "ask_increment_usd",
    }
)
# Budgets are whole nano-dollars (usage.md); a bundle may set at most a million dollars.
NANO_PER_USD = 1_000_000_000
MAX_BUDGET_USD = 1_000_000

MAX_RULES = 200
MAX_NAME_CHARS = 128
MAX_TOOLS = 64
MAX_GLOB_CHARS = 256
MAX_WHEN = 32
MAX_ARGUMENT_NAME_CHARS = 256
MAX_REGEX_CHARS = 1_000
MAX_REASON_CHARS = 2_000
MAX_ASK_TIMEOUT = 7 * 24 * 3600.0
DEFAULT_ASK_TIMEOUT = 3600.0
# ``when`` regexes see at most this much of an argument, so one huge argument cannot
# make a rule check slow.
MATCH_WINDOW = 64 * 1024

OS_TOOLS_RULE = PolicyRule(name="ask_on_os_tools", tools=["sys_os_*"], action="ask")
MCP_TOOLS_RULE_NAME = "ask_on_mcp_tools"

# PostgreSQL's jsonb refuses NUL and UTF-8 cannot encode lone surrogates: a rule holding
# either could be accepted but never stored or sent.
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


class RuleError(ValueError):
    """Rules that do not validate. ``fields`` maps a path (``rules.0.action``,
    ``rules.2.when.command``, ``guardrails.ask_timeout``) to what is wrong there; every
    problem found is listed, not just the first."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields: dict[str, str] = dict(fields)
        shown = "; ".join(f"{path}: {problem}" for path, problem in list(self.fields.items())[:5])
        more = f" (and {len(self.fields) - 5} more)" if len(self.fields) > 5 else ""
        super().__init__(f"invalid policy rules: {shown}{more}")


class Guardrails(msgspec.Struct, frozen=True, kw_only=True):
    """A bundle's ``guardrails`` block, checked: its rules (the ``ask_on_os_tools``
    shorthand already expanded, first) and its default ``ask_timeout``."""

    rules: list[PolicyRule] = []
    ask_timeout: float | None = None
    # The session budget the bundle sets (``budget_usd``), what happens when a call would
    # start with it spent (``on_budget``, default ``ask``), and how much an accepted
    # budget question adds (``ask_increment_usd``; ``None``: the budget again). usage.md.
    budget_nano: int | None = None
    on_budget: Literal["ask", "deny"] = "ask"
    ask_increment_nano: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The block in a form :func:`parse_guardrails` reads back to the same value."""
        block: dict[str, Any] = {"policies": rules_as_json(self.rules)}
        if self.ask_timeout is not None:
            block["ask_timeout"] = self.ask_timeout
        if self.budget_nano is not None:
            block["budget_usd"] = nano_as_usd(self.budget_nano)
        if self.on_budget != "ask":
            block["on_budget"] = self.on_budget
        if self.ask_increment_nano is not None:
            block["ask_increment_usd"] = nano_as_usd(self.ask_increment_nano)
        return block


NO_GUARDRAILS = Guardrails()


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` found: the action and the rule that chose it (None: no rule
    matched, so the call is allowed)."""

    action: Action
    rule: PolicyRule | None = None


# --- validation ----------------------------------------------------------------------


def parse_rules(raw: object, *, prefix: str = "rules") -> list[PolicyRule]:
    """Validate a JSON list of rules; raise :class:`RuleError` naming every problem.

    Types are strict (no coercion; a boolean is not a number); ``null`` for an optional
    field means "not given".
    """
    errors: dict[str, str] = {}
    if not isinstance(raw, list):
        raise RuleError({prefix: f"must be a list of rules, not {_kind(raw)}"})
    if len(raw) > MAX_RULES:
        raise RuleError({prefix: f"at most {MAX_RULES} rules are allowed (got {len(raw)})"})
    rules: list[PolicyRule] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        rule = _parse_rule(item, f"{prefix}.{index}", errors)
        if rule is None:
            continue
        if rule.name in seen:
            errors[f"{prefix}.{index}.name"] = f"name {rule.name!r} is used by an earlier rule"
        seen.add(rule.name)
        rules.append(rule)
    if errors:
        raise RuleError(errors)
    return rules


def parse_guardrails(raw: object, *, mcp_servers: Sequence[str] = ()) -> Guardrails:
    """Validate a bundle's ``guardrails`` block (agents.md); ``None`` means no block.

    Unknown keys are refused rather than ignored: a misspelt ``ask_on_os_tools`` must not
    silently leave an agent unguarded. ``mcp_servers`` are the bundle's MCP server names:
    the ``ask_on_mcp_tools`` shorthand asks before every tool of each (``<name>__*``).
    """
    if raw is None:
        return NO_GUARDRAILS
    if not isinstance(raw, dict):
        raise RuleError({"guardrails": f"must be a mapping, not {_kind(raw)}"})
    errors: dict[str, str] = {}
    for key in raw:
        if key not in GUARDRAILS_KEYS:
            errors[f"guardrails.{key}"] = (
                "unknown key (expected ask_on_os_tools, ask_on_mcp_tools, ask_timeout, "
                "policies, budget_usd, on_budget, ask_increment_usd)"
            )
    shorthand = raw.get("ask_on_os_tools")
    if shorthand is not None and not isinstance(shorthand, bool):
        errors["guardrails.ask_on_os_tools"] = f"must be true or false, not {_kind(shorthand)}"
    mcp_shorthand = raw.get("ask_on_mcp_tools")
    if mcp_shorthand is not None and not isinstance(mcp_shorthand, bool):
        errors["guardrails.ask_on_mcp_tools"] = f"must be true or false, not {_kind(mcp_shorthand)}"
    ask_timeout = _ask_timeout(raw.get("ask_timeout"), "guardrails.ask_timeout", errors)
    budget_nano = _usd_nano(raw.get("budget_usd"), "guardrails.budget_usd", errors, zero=True)
    increment_nano = _usd_nano(
        raw.get("ask_increment_usd"), "guardrails.ask_increment_usd", errors, zero=False
    )
    on_budget = raw.get("on_budget", "ask")
    if on_budget not in ("ask", "deny"):
        errors["guardrails.on_budget"] = 'must be "ask" or "deny"'
        on_budget = "ask"
    rules: list[PolicyRule] = []
    policies = raw.get("policies")
    if policies is not None:
        try:
            rules = parse_rules(policies, prefix="guardrails.policies")
        except RuleError as exc:
            errors.update(exc.fields)
    if shorthand is True:
        for index, rule in enumerate(rules):
            if rule.name == OS_TOOLS_RULE.name:
                errors[f"guardrails.policies.{index}.name"] = (
                    f"name {rule.name!r} is taken by the ask_on_os_tools shorthand"
                )
        rules = [OS_TOOLS_RULE, *rules]
    if mcp_shorthand is True and mcp_servers:
        for index, rule in enumerate(rules):
            if rule.name == MCP_TOOLS_RULE_NAME:
                errors[f"guardrails.policies.{index}.name"] = (
                    f"name {rule.name!r} is taken by the ask_on_mcp_tools shorthand"
                )
        mcp_rule = PolicyRule(
            name=MCP_TOOLS_RULE_NAME, tools=[f"{name}__*" for name in mcp_servers], action="ask"
        )
        at = 1 if shorthand is True else 0
        rules = [*rules[:at], mcp_rule, *rules[at:]]
    if errors:
        raise RuleError(errors)
    return Guardrails(
        rules=rules,
        ask_timeout=ask_timeout,
        budget_nano=budget_nano,
        on_budget=on_budget,
        ask_increment_nano=increment_nano,
    )


def effective_rules(
    *,
    session_rules: Sequence[PolicyRule],
    bundle: Guardrails,
    default_ask_timeout: float = DEFAULT_ASK_TIMEOUT,
    max_ask_timeout: float | None = None,
) -> list[PolicyRule]:
    """The list the runner evaluates: session rules first, then the bundle's.

    Every ``ask`` rule carries its timeout: its own, else the bundle's, else
    ``default_ask_timeout``; ``max_ask_timeout`` (the server's cap) bounds it.
    """
    result: list[PolicyRule] = []
    for rule in [*session_rules, *bundle.rules]:
        if rule.action == "ask":
            timeout = rule.ask_timeout or bundle.ask_timeout or default_ask_timeout
            if max_ask_timeout is not None:
                timeout = min(timeout, max_ask_timeout)
            if timeout != rule.ask_timeout:
                rule = msgspec.structs.replace(rule, ask_timeout=timeout)
        result.append(rule)
    return result


def rules_as_json(rules: Sequence[PolicyRule]) -> list[dict[str, Any]]:
    """Rules as plain JSON objects (unset optional fields left out)."""
    return [msgspec.to_builtins(rule) for rule in rules]


# --- deciding a call ---------------------------------------------------------------------


def decide(rules: Sequence[PolicyRule], *, tool: str, arguments: Mapping[str, object]) -> Decision:
    """The first rule that matches the call decides; no match allows it."""
    for rule in rules:
        if matches(rule, tool=tool, arguments=arguments):
            return Decision(action=rule.action, rule=rule)
    return Decision(action="allow")


def matches(rule: PolicyRule, *, tool: str, arguments: Mapping[str, object]) -> bool:
    """Whether ``rule`` applies: a tool glob matches the name (case-sensitive) and every
    ``when`` argument exists, is a string and contains a match of its regex."""
    for glob in rule.tools:
        if fnmatch.fnmatchcase(tool, glob):
            break
    else:
        return False
    if rule.when:
        for name, pattern in rule.when.items():
            value = arguments.get(name)
            if not isinstance(value, str):
                return False
            if _compiled(pattern).search(value[:MATCH_WINDOW]) is None:
                return False
    return True


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# --- field checks ------------------------------------------------------------------------


def _parse_rule(item: object, path: str, errors: dict[str, str]) -> PolicyRule | None:
    if not isinstance(item, dict):
        errors[path] = f"a rule must be an object, not {_kind(item)}"
        return None
    before = len(errors)
    for key in item:
        if key not in RULE_KEYS:
            errors[f"{path}.{key}"] = "unknown field"
    name = _text(item.get("name"), f"{path}.name", errors, limit=MAX_NAME_CHARS, required=True)
    tools = _tools(item.get("tools"), f"{path}.tools", errors)
    when = _when(item.get("when"), f"{path}.when", errors)
    action = item.get("action")
    if action not in ACTIONS:
        shown = "missing" if action is None else f"got {_short(action)}"
        errors[f"{path}.action"] = f"must be one of allow, deny, ask ({shown})"
    reason = _text(item.get("reason"), f"{path}.reason", errors, limit=MAX_REASON_CHARS)
    ask_timeout = _ask_timeout(item.get("ask_timeout"), f"{path}.ask_timeout", errors)
    if len(errors) > before or name is None or tools is None or action not in ACTIONS:
        # A rule with a valid name still counts for uniqueness in the caller, so a
        # duplicate is reported even next to other errors.
        if name is not None and f"{path}.name" not in errors:
            return PolicyRule(name=name, tools=[], action="allow")
        return None
    return PolicyRule(
        name=name,
        tools=tools,
        action=action,
        when=when,
        reason=reason,
        ask_timeout=ask_timeout,
    )


def _text(
    value: object, path: str, errors: dict[str, str], *, limit: int, required: bool = False
) -> str | None:
    if value is None:
        if required:
            errors[path] = "is required"
        return None
    if not isinstance(value, str):
        errors[path] = f"must be a string, not {_kind(value)}"
        return None
    if required and not value.strip():
        errors[path] = "must not be empty"
        return None
    if len(value) > limit:
        errors[path] = f"must be at most {limit} characters"
        return None
    if _UNSTORABLE_RE.search(value):
        errors[path] = "must not contain NUL characters or lone surrogates"
        return None
    return value


def _tools(value: object, path: str, errors: dict[str, str]) -> list[str] | None:
    if value is None:
        errors[path] = "is required (a non-empty list of tool name globs)"
        return None
    if not isinstance(value, list):
        errors[path] = f"must be a list of tool name globs, not {_kind(value)}"
        return None
    if not value:
        errors[path] = "must name at least one tool glob"
        return None
    if len(value) > MAX_TOOLS:
        errors[path] = f"at most {MAX_TOOLS} globs are allowed"
        return None
    globs: list[str] = []
    for index, glob in enumerate(value):
        checked = _text(glob, f"{path}.{index}", errors, limit=MAX_GLOB_CHARS, required=True)
        if checked is not None:
            globs.append(checked)
    return globs if len(globs) == len(value) else None


def _when(value: object, path: str, errors: dict[str, str]) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        errors[path] = f"must be an object of argument name -> regex, not {_kind(value)}"
        return None
    if len(value) > MAX_WHEN:
        errors[path] = f"at most {MAX_WHEN} arguments may be matched"
        return None
    when: dict[str, str] = {}
    for name, pattern in value.items():
        where = f"{path}.{name}"
        if (
            not isinstance(name, str)
            or not name
            or len(name) > MAX_ARGUMENT_NAME_CHARS
            or _UNSTORABLE_RE.search(name)
        ):
            errors[where] = f"argument names must be 1-{MAX_ARGUMENT_NAME_CHARS} plain characters"
            continue
        checked = _text(pattern, where, errors, limit=MAX_REGEX_CHARS)
        if checked is None:
            if where not in errors:
                errors[where] = "must be a regex string"
            continue
        try:
            _compiled(checked)
        except (re.error, RecursionError, OverflowError) as exc:
            errors[where] = f"not a valid regular expression: {exc}"
            continue
        when[name] = checked
    return when


def _ask_timeout(value: object, path: str, errors: dict[str, str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors[path] = f"must be a number of seconds, not {_kind(value)}"
        return None
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_ASK_TIMEOUT):
        errors[path] = f"must be more than 0 and at most {int(MAX_ASK_TIMEOUT)} seconds (7 days)"
        return None
    return seconds


def usd_as_nano(usd: int | float) -> int:
    """Dollars as whole nano-dollars, rounded half up, read from the number's shortest
    decimal form (so ``0.1`` is exactly 100,000,000)."""
    return int((Decimal(repr(usd)) * NANO_PER_USD).to_integral_value(ROUND_HALF_UP))


def nano_as_usd(nano: int) -> float:
    """Nano-dollars as a JSON number of dollars."""
    return float(Decimal(nano) / NANO_PER_USD)


def _usd_nano(value: object, path: str, errors: dict[str, str], *, zero: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors[path] = f"must be a number of dollars, not {_kind(value)}"
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        errors[path] = "must be " + ("0 or more" if zero else "more than 0") + " dollars"
        return None
    if value > MAX_BUDGET_USD:
        errors[path] = f"must be at most {MAX_BUDGET_USD:,} dollars"
        return None
    return usd_as_nano(value)


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), f"a value of type {type(value).__name__}")


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
