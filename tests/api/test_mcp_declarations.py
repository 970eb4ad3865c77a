"""MCP server declarations at upload (mcp.md, "Declaration"): a bad one is a 400 naming
the field; header and env values are never stored in the spec or shown."""

from __future__ import annotations

import json

import pytest

from omnigent_runner.bundles import build_bundle
from sessions.models import Session

from .conftest import ALICE, assert_error, assert_nothing_written, upload

pytestmark = pytest.mark.django_db

BASE = "name: helper\nprompt: You help.\n"
SECRET = "Bearer sk-mcp-0123456789"


def bundle(tools_yaml: str) -> bytes:
    return build_bundle({"agent.yaml": BASE + "tools:\n" + tools_yaml})


@pytest.mark.parametrize(
    ("tools_yaml", "field"),
    [
        ("  git: {type: mcp}\n", "tools.git"),
        ("  git: {type: mcp, command: x, args: [1]}\n", "tools.git.args"),
        ("  git: {type: mcp, command: x, env: {A: 1}}\n", "tools.git.env"),
        ("  d: {type: mcp, url: 'http://h/mcp', headers: [x]}\n", "tools.d.headers"),
        ("  git: {type: mcp, command: x, timeout: 0}\n", "tools.git.timeout"),
        ("  sys_os_read: {type: mcp, command: x}\n", "tools.sys_os_read"),
    ],
)
def test_bad_declaration_is_a_400_naming_the_field(client_for, tools_yaml, field) -> None:
    response = client_for(ALICE).post(
        "/v1/sessions", {"bundle": upload(bundle(tools_yaml))}, format="multipart"
    )
    error = assert_error(response, 400, "invalid_input", mentions=field)
    assert field in error["fields"]
    assert_nothing_written()


def test_header_and_env_values_are_never_stored_or_shown(client_for) -> None:
    data = bundle(
        "  git: {type: mcp, command: python, args: ['-m', 'x'], env: {TOKEN: env-s3cret}}\n"
        f"  docs: {{type: mcp, url: 'http://u:pw@127.0.0.1:9/mcp', headers: {{A: '{SECRET}'}}}}\n"
    )
    client = client_for(ALICE)
    response = client.post("/v1/sessions", {"bundle": upload(data)}, format="multipart")
    assert response.status_code == 201, response.content
    session = Session.objects.select_related("agent").get(pk=response.json()["session_id"])
    stored = json.dumps(session.agent.spec)
    for secret in (SECRET, "env-s3cret", "u:pw"):
        assert secret not in stored
    agent = client.get(f"/v1/sessions/{session.id}/agent")
    assert agent.status_code == 200
    text = agent.content.decode()
    for secret in (SECRET, "env-s3cret", "u:pw"):
        assert secret not in text
    servers = agent.json()["mcp_servers"]
    assert [(s["name"], s["transport"], s["status"]) for s in servers] == [
        ("git", "stdio", "stopped"),
        ("docs", "http", "stopped"),
    ]
    assert servers[0]["command"] == "python" and servers[0]["args"] == ["-m", "x"]
    assert servers[1]["url"] == "http://127.0.0.1:9/mcp"
