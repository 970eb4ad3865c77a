"""Policy rules (omnigent_runner/policies.py): validation, the effective order, decisions."""

from __future__ import annotations

from typing import Any

import pytest

from omnigent_runner.bundles import BundleError, build_bundle, parse_bundle
from omnigent_runner.policies import (
    MATCH_WINDOW,
    MAX_RULES,
    NO_GUARDRAILS,
    Guardrails,
    RuleError,
    decide,
    effective_rules,
    parse_guardrails,
    parse_rules,
    rules_as_json,
)
from omnigent_runner.protocol import PolicyRule


def rule(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "r", "tools": ["sys_os_shell"], "action": "deny"}
    base.update(overrides)
    return base


def errors_of(raw: object, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(RuleError) as caught:
        parse_rules(raw, **kwargs)
    assert str(caught.value).startswith("invalid policy rules: ")
    return caught.value.fields


# --- parse_rules: valid input ------------------------------------------------------------


def test_full_rule_parses_to_struct() -> None:
    raw = [
        rule(
            name="no-rm",
            when={"command": r"\brm\s"},
            reason="no deleting",
            ask_timeout=30,
            action="ask",
        )
    ]
    [parsed] = parse_rules(raw)
    assert parsed == PolicyRule(
        name="no-rm",
        tools=["sys_os_shell"],
        action="ask",
        when={"command": r"\brm\s"},
        reason="no deleting",
        ask_timeout=30.0,
    )
    assert isinstance(parsed.ask_timeout, float)
    assert rules_as_json([parsed]) == [{**raw[0], "ask_timeout": 30.0}]


def test_optional_fields_may_be_absent_or_null() -> None:
    [parsed] = parse_rules([rule(when=None, reason=None, ask_timeout=None)])
    assert parsed.when is None and parsed.reason is None and parsed.ask_timeout is None
    assert rules_as_json([parsed]) == [rule()]


def test_empty_list_is_valid() -> None:
    assert parse_rules([]) == []


# --- parse_rules: every validation error --------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"rules": []}, {"rules": "must be a list of rules, not an object"}),
        (None, {"rules": "must be a list of rules, not null"}),
        ([rule()] * (MAX_RULES + 1), {"rules": f"at most {MAX_RULES} rules are allowed (got 201)"}),
        (["x"], {"rules.0": "a rule must be an object, not a string"}),
    ],
)
def test_list_level_errors(raw: object, expected: dict[str, str]) -> None:
    assert errors_of(raw) == expected


@pytest.mark.parametrize(
    ("overrides", "path", "fragment"),
    [
        ({"action": "maybe"}, "action", "must be one of allow, deny, ask (got 'maybe')"),
        ({"action": None}, "action", "(missing)"),
        ({"action": True}, "action", "must be one of"),
        ({"name": None}, "name", "is required"),
        ({"name": ""}, "name", "must not be empty"),
        ({"name": "  "}, "name", "must not be empty"),
        ({"name": 7}, "name", "must be a string, not a number"),
        ({"name": "n" * 129}, "name", "at most 128 characters"),
        ({"name": "a\x00b"}, "name", "NUL"),
        ({"tools": None}, "tools", "is required"),
        ({"tools": []}, "tools", "at least one"),
        ({"tools": "sys_os_shell"}, "tools", "must be a list"),
        ({"tools": ["x"] * 65}, "tools", "at most 64"),
        ({"tools": ["ok", ""]}, "tools.1", "must not be empty"),
        ({"tools": ["ok", 3]}, "tools.1", "must be a string"),
        ({"when": ["command"]}, "when", "must be an object"),
        ({"when": {"command": "("}}, "when.command", "not a valid regular expression"),
        ({"when": {"command": 5}}, "when.command", "must be a string, not a number"),
        ({"when": {"command": None}}, "when.command", "must be a regex string"),
        ({"when": {"command": "a" * 1001}}, "when.command", "at most 1000 characters"),
        ({"when": {"": "x"}}, "when.", "argument names"),
        ({"when": {f"a{i}": "x" for i in range(33)}}, "when", "at most 32"),
        ({"reason": 3}, "reason", "must be a string"),
        ({"reason": "r" * 2001}, "reason", "at most 2000"),
        ({"ask_timeout": 0}, "ask_timeout", "more than 0"),
        ({"ask_timeout": -5}, "ask_timeout", "more than 0"),
        ({"ask_timeout": 7 * 24 * 3600 + 1}, "ask_timeout", "at most 604800"),
        ({"ask_timeout": float("nan")}, "ask_timeout", "more than 0"),
        ({"ask_timeout": 10**400}, "ask_timeout", "more than 0"),
        ({"ask_timeout": True}, "ask_timeout", "not a boolean"),
        ({"ask_timeout": "60"}, "ask_timeout", "not a string"),
        ({"extra": 1}, "extra", "unknown field"),
    ],
)
def test_field_errors(overrides: dict[str, Any], path: str, fragment: str) -> None:
    fields = errors_of([rule(name="ok"), rule(**overrides)])
    assert list(fields) == [f"rules.1.{path}"]
    assert fragment in fields[f"rules.1.{path}"]


def test_ask_timeout_of_exactly_seven_days_is_valid() -> None:
    [parsed] = parse_rules([rule(ask_timeout=7 * 24 * 3600)])
    assert parsed.ask_timeout == 604800.0


def test_duplicate_name_is_reported_even_next_to_other_errors() -> None:
    fields = errors_of([rule(name="a"), rule(name="a", action="nope"), rule(name="a")])
    assert fields == {
        "rules.1.action": "must be one of allow, deny, ask (got 'nope')",
        "rules.1.name": "name 'a' is used by an earlier rule",
        "rules.2.name": "name 'a' is used by an earlier rule",
    }


def test_all_errors_are_collected_with_prefix() -> None:
    fields = errors_of([{"tools": [], "action": "x", "when": {"c": "["}}], prefix="p")
    assert set(fields) == {"p.0.name", "p.0.tools", "p.0.action", "p.0.when.c"}


def test_message_summarises_at_most_five() -> None:
    with pytest.raises(RuleError) as caught:
        parse_rules([7] * 8)
    assert "(and 3 more)" in str(caught.value)


# --- guardrails --------------------------------------------------------------------------


def test_guardrails_absent_is_empty() -> None:
    assert parse_guardrails(None) is NO_GUARDRAILS
    assert parse_guardrails({}) == Guardrails()


def test_shorthand_puts_os_rule_first() -> None:
    parsed = parse_guardrails(
        {"ask_on_os_tools": True, "ask_timeout": 90, "policies": [rule(name="no-rm")]}
    )
    assert [r.name for r in parsed.rules] == ["ask_on_os_tools", "no-rm"]
    assert parsed.rules[0] == PolicyRule(name="ask_on_os_tools", tools=["sys_os_*"], action="ask")
    assert parsed.ask_timeout == 90.0
    assert parse_guardrails(parsed.as_json()) == parsed  # the stored form reads back


def test_shorthand_false_adds_nothing() -> None:
    assert parse_guardrails({"ask_on_os_tools": False}).rules == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([], {"guardrails": "must be a mapping, not a list"}),
        (
            {"ask_on_os_tools": "yes"},
            {"guardrails.ask_on_os_tools": "must be true or false, not a string"},
        ),
        (
            {"ask_timeout": 0},
            {"guardrails.ask_timeout": "must be more than 0 and at most 604800 seconds (7 days)"},
        ),
        (
            {"polices": []},
            {
                "guardrails.polices": "unknown key (expected ask_on_os_tools, ask_on_mcp_tools, "
                "ask_timeout, policies, budget_usd, on_budget, ask_increment_usd)"
            },
        ),
        ({"policies": {}}, {"guardrails.policies": "must be a list of rules, not an object"}),
        (
            {"policies": [rule(action="x")]},
            {"guardrails.policies.0.action": "must be one of allow, deny, ask (got 'x')"},
        ),
        (
            {"ask_on_os_tools": True, "policies": [rule(name="ask_on_os_tools")]},
            {
                "guardrails.policies.0.name": "name 'ask_on_os_tools' is taken by the ask_on_os_tools shorthand"
            },
        ),
    ],
)
def test_guardrails_errors(raw: object, expected: dict[str, str]) -> None:
    with pytest.raises(RuleError) as caught:
        parse_guardrails(raw)
    assert caught.value.fields == expected


def bundle_with(guardrails: str) -> bytes:
    return build_bundle({"agent.yaml": f"name: a\nprompt: p\n{guardrails}"})


def test_bundle_exposes_guardrails() -> None:
    spec = parse_bundle(
        bundle_with(
            "guardrails:\n"
            "  ask_on_os_tools: true\n"
            "  ask_timeout: 120\n"
            "  policies:\n"
            "    - {name: no-rm, tools: [sys_os_shell], when: {command: '\\brm\\s'},"
            " action: deny, reason: no deleting}\n"
        )
    ).spec
    assert [r.name for r in spec.guardrails.rules] == ["ask_on_os_tools", "no-rm"]
    assert spec.guardrails.rules[1].when == {"command": r"\brm\s"}
    assert spec.guardrails.ask_timeout == 120.0
    assert spec.unknown_keys == ()
    assert spec.public_dict()["guardrails"] == spec.guardrails.as_json()


def test_bundle_without_guardrails_has_none() -> None:
    spec = parse_bundle(bundle_with("")).spec
    assert spec.guardrails == NO_GUARDRAILS
    assert spec.public_dict()["guardrails"] == {"policies": []}


def test_bad_guardrails_is_a_bundle_error_naming_the_field() -> None:
    with pytest.raises(BundleError) as caught:
        parse_bundle(
            bundle_with("guardrails:\n  policies:\n    - {name: x, tools: [], action: deny}\n")
        )
    assert "guardrails.policies.0.tools" in str(caught.value)


# --- effective rules ---------------------------------------------------------------------


def test_effective_order_and_timeouts() -> None:
    session = parse_rules(
        [rule(name="s-ask", action="ask"), rule(name="s-own", action="ask", ask_timeout=5)]
    )
    bundle = parse_guardrails(
        {"ask_on_os_tools": True, "ask_timeout": 200, "policies": [rule(name="b-deny")]}
    )
    result = effective_rules(session_rules=session, bundle=bundle)
    assert [r.name for r in result] == ["s-ask", "s-own", "ask_on_os_tools", "b-deny"]
    assert [r.ask_timeout for r in result] == [200.0, 5.0, 200.0, None]


def test_effective_default_and_cap() -> None:
    session = parse_rules(
        [rule(name="a", action="ask"), rule(name="b", action="ask", ask_timeout=9000)]
    )
    result = effective_rules(
        session_rules=session, bundle=NO_GUARDRAILS, default_ask_timeout=3600, max_ask_timeout=4000
    )
    assert [r.ask_timeout for r in result] == [3600.0, 4000.0]
    plain = effective_rules(session_rules=session, bundle=NO_GUARDRAILS)
    assert [r.ask_timeout for r in plain] == [3600.0, 9000.0]
    assert session[0].ask_timeout is None  # the inputs are not changed


# --- decide ------------------------------------------------------------------------------


def test_no_rules_allows() -> None:
    decision = decide([], tool="sys_os_shell", arguments={})
    assert decision.action == "allow" and decision.rule is None


def test_first_match_decides() -> None:
    rules = parse_rules(
        [
            rule(name="allow-ls", tools=["sys_os_shell"], when={"command": "^ls"}, action="allow"),
            rule(name="ask-shell", tools=["sys_os_*"], action="ask"),
            rule(name="deny-all", tools=["*"], action="deny"),
        ]
    )
    assert decide(rules, tool="sys_os_shell", arguments={"command": "ls -la"}).rule == rules[0]
    assert decide(rules, tool="sys_os_shell", arguments={"command": "rm x"}).rule == rules[1]
    assert decide(rules, tool="sys_os_read_file", arguments={}).action == "ask"
    assert decide(rules, tool="lookup", arguments={}).rule == rules[2]


@pytest.mark.parametrize(
    ("globs", "tool", "hit"),
    [
        (["sys_os_*"], "sys_os_shell", True),
        (["sys_os_*"], "my_sys_os_shell", False),
        (["sys_os_shell"], "SYS_OS_SHELL", False),  # case-sensitive
        (["sys_os_?ead_file"], "sys_os_read_file", True),
        (["get_[ab]"], "get_b", True),
        (["get_[ab]"], "get_c", False),
        (["one", "two"], "two", True),
    ],
)
def test_tool_globs(globs: list[str], tool: str, hit: bool) -> None:
    rules = parse_rules([rule(tools=globs)])
    assert decide(rules, tool=tool, arguments={}).action == ("deny" if hit else "allow")


@pytest.mark.parametrize(
    ("arguments", "hit"),
    [
        ({"command": "sudo rm -rf /", "cwd": "/tmp"}, True),
        ({"command": "ls", "cwd": "/tmp"}, False),  # regex does not match
        ({"command": "rm x"}, False),  # an argument named in `when` is missing
        ({"command": "rm x", "cwd": 5}, False),  # not a string
        ({"command": ["rm x"], "cwd": "/tmp"}, False),
        ({"command": None, "cwd": "/tmp"}, False),
    ],
)
def test_when_matching(arguments: dict[str, Any], hit: bool) -> None:
    rules = parse_rules([rule(when={"command": r"\brm\s", "cwd": "^/tmp"})])
    assert decide(rules, tool="sys_os_shell", arguments=arguments).action == (
        "deny" if hit else "allow"
    )


def test_when_matches_only_the_first_64_kib() -> None:
    rules = parse_rules([rule(when={"content": "SECRET"})])
    near = "x" * (MATCH_WINDOW - 6) + "SECRET"
    far = "x" * (MATCH_WINDOW - 5) + "SECRET"
    assert decide(rules, tool="sys_os_shell", arguments={"content": near}).action == "deny"
    assert decide(rules, tool="sys_os_shell", arguments={"content": far}).action == "allow"
