"""MCP server declarations in a bundle (mcp.md, "Declaration"), without Django."""

from __future__ import annotations

import json

import pytest

from omnigent_runner import mcp_spec
from omnigent_runner.bundles import BundleError, build_bundle, parse_bundle
from omnigent_runner.mcp_spec import ExpansionError, McpDeclarationError, expand, tool_name

BASE = "name: helper\nprompt: You help.\n"


def spec_of(tools_yaml: str, extra: str = ""):
    return parse_bundle(build_bundle({"agent.yaml": BASE + extra + "tools:\n" + tools_yaml})).spec


def rejected(tools_yaml: str, extra: str = "") -> BundleError:
    with pytest.raises(BundleError) as caught:
        spec_of(tools_yaml, extra)
    return caught.value


def test_declarations_are_read_in_order_and_other_tools_keys_are_kept() -> None:
    spec = spec_of(
        "  git:\n"
        "    type: mcp\n"
        "    command: python\n"
        '    args: ["-m", "mcp_server_git", "--repository", "."]\n'
        "    env: {GIT_AUTHOR_NAME: agent}\n"
        "    tools: [git_status, git_diff]\n"
        "    timeout: 60\n"
        "    description: Git of the workspace\n"
        "  docs:\n"
        "    type: mcp\n"
        "    url: http://user:pw@127.0.0.1:9000/mcp?key=abc\n"
        '    headers: {Authorization: "Bearer s3cret"}\n'
        "  legacy:\n"
        "    type: mcp\n"
        "    url: http://127.0.0.1:9000/sse\n"
        "  web_search: {type: builtin}\n"
        "  other: 3\n"
    )
    git, docs, legacy = spec.mcp_servers
    assert (git.name, git.transport, git.command) == ("git", "stdio", "python")
    assert git.args == ("-m", "mcp_server_git", "--repository", ".")
    assert git.env == {"GIT_AUTHOR_NAME": "agent"}
    assert git.tools == ("git_status", "git_diff")
    assert git.timeout == 60 and git.description == "Git of the workspace"
    assert (docs.transport, docs.timeout, docs.tools) == ("http", 120.0, None)
    assert legacy.transport == "sse"
    assert "tools" not in spec.unknown_keys
    shown = spec.public_dict()
    text = json.dumps(shown)
    assert "s3cret" not in text and "agent" not in json.dumps(shown["raw"]["tools"]["git"]["env"])
    assert ":pw@" not in text and "key=abc" not in text
    assert shown["raw"]["tools"]["docs"]["headers"] == {"Authorization": "[REDACTED]"}
    assert shown["raw"]["tools"]["web_search"] == {"type": "builtin"}
    assert shown["mcp_servers"][1]["url"] == "http://127.0.0.1:9000/mcp?[REDACTED]"
    assert [server["name"] for server in shown["mcp_servers"]] == ["git", "docs", "legacy"]


def test_a_tools_list_is_kept_and_ignored() -> None:
    assert spec_of("  - {type: mcp, command: x}\n").mcp_servers == ()


@pytest.mark.parametrize(
    ("tools_yaml", "field", "mentions"),
    [
        ("  git: {type: mcp}\n", "tools.git", "exactly one of"),
        ("  git: {type: mcp, command: x, url: 'http://h/mcp'}\n", "tools.git", "exactly one of"),
        ("  git: {type: mcp, command: x, args: [1]}\n", "tools.git.args", "list of strings"),
        ("  git: {type: mcp, command: x, args: '-v'}\n", "tools.git.args", "list of strings"),
        ("  git: {type: mcp, command: x, env: {A: 1}}\n", "tools.git.env", "string values"),
        ("  git: {type: mcp, command: x, env: [A]}\n", "tools.git.env", "mapping"),
        ("  d: {type: mcp, url: 'http://h/mcp', headers: {A: [1]}}\n", "tools.d.headers", "string"),
        ("  git: {type: mcp, command: x, timeout: 0}\n", "tools.git.timeout", "1 to 3600"),
        ("  git: {type: mcp, command: x, timeout: 3601}\n", "tools.git.timeout", "1 to 3600"),
        ("  git: {type: mcp, command: x, timeout: true}\n", "tools.git.timeout", "1 to 3600"),
        ("  git: {type: mcp, command: x, tools: git_status}\n", "tools.git.tools", "list"),
        ("  'bad name': {type: mcp, command: x}\n", "tools.bad name", "1-64 characters"),
        (f"  {'a' * 65}: {{type: mcp, command: x}}\n", f"tools.{'a' * 65}", "1-64 characters"),
        ("  sys_os_shell: {type: mcp, command: x}\n", "tools.sys_os_shell", "built-in"),
        (
            "  git: {type: mcp, command: x}\n  GIT: {type: mcp, command: y}\n",
            "tools.GIT",
            "clashes",
        ),
        ("  d: {type: mcp, url: 'ftp://h/mcp'}\n", "tools.d.url", "http"),
        ("  git: {type: mcp, command: ''}\n", "tools.git.command", "non-empty"),
        ("  git: {type: mcp, command: x, headers: {A: b}}\n", "tools.git.headers", "HTTP"),
        (
            "".join(f"  s{i}: {{type: mcp, command: x}}\n" for i in range(17)),
            "tools",
            "at most 16",
        ),
    ],
)
def test_rejections_name_the_field(tools_yaml: str, field: str, mentions: str) -> None:
    error = rejected(tools_yaml)
    assert error.field == field
    assert str(error).startswith(field + ":")
    assert mentions in str(error)


def test_sixteen_servers_are_allowed() -> None:
    tools = "".join(f"  s{i}: {{type: mcp, command: x}}\n" for i in range(16))
    assert len(spec_of(tools).mcp_servers) == 16


def test_ask_on_mcp_tools_asks_for_every_server_tool() -> None:
    spec = spec_of(
        "  git: {type: mcp, command: x}\n  docs: {type: mcp, url: 'http://h/mcp'}\n",
        extra="guardrails: {ask_on_os_tools: true, ask_on_mcp_tools: true}\n",
    )
    names = [rule.name for rule in spec.guardrails.rules]
    assert names == ["ask_on_os_tools", "ask_on_mcp_tools"]
    assert spec.guardrails.rules[1].tools == ["git__*", "docs__*"]
    assert spec.guardrails.rules[1].action == "ask"


def test_expansion_only_for_allowed_names() -> None:
    env = {"TOKEN": "t0k", "OTHER": "x"}
    assert expand("Bearer ${TOKEN}", allowed={"TOKEN"}, env=env) == "Bearer t0k"
    with pytest.raises(ExpansionError, match="not allowed"):
        expand("${OTHER}", allowed={"TOKEN"}, env=env)
    with pytest.raises(ExpansionError, match="not set"):
        expand("${MISSING}", allowed={"MISSING"}, env=env)
    assert expand("$HOME and $${X", allowed=set(), env=env) == "$HOME and $${X"


def test_long_tool_names_are_cut_consistently() -> None:
    assert tool_name("git", "git_status") == "git__git_status"
    long = tool_name("server", "t" * 80)
    assert len(long) == 64 and long == tool_name("server", "t" * 80)
    assert long.startswith("server__ttt") and long[55] == "_"
    assert long != tool_name("server", "t" * 81)


def test_declaration_error_carries_field() -> None:
    error = McpDeclarationError("tools.x.args", "bad")
    assert (error.field, error.problem, str(error)) == ("tools.x.args", "bad", "tools.x.args: bad")
    assert mcp_spec.MAX_SERVERS == 16
