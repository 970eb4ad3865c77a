"""The session page with MCP servers (mcp.md, "What the server stores and shows"): the
servers panel with state and tools, an MCP server's question as a form of its schema,
and the call's card with its server as a badge and an image tool's picture. A real daphne, runner, mock LLM and the
project's MCP test server behind Debian's chromium, as in test_web_page.py."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mcp_server import PNG_1X1
from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message
from tests.browser.test_web_page import ALICE, OS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SERVER = Path(__file__).resolve().parents[2] / "testing" / "mcp_server.py"
TOOLS = (
    "tools:\n"
    f"  t:\n    type: mcp\n    command: {sys.executable}\n    args: [{json.dumps(str(SERVER))}]\n"
)


def test_servers_panel_question_form_and_server_badge(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = create_session(server, make_bundle("mcp", extra=OS_ENV + TOOLS))
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(extra_http_headers={"X-Forwarded-Email": ALICE})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")

    mock_llm.configure(
        [
            {
                "tool_calls": [
                    {"call_id": "c1", "name": "t__confirm", "arguments": {"question": "Ship?"}},
                    {"call_id": "c2", "name": "t__image", "arguments": {}},
                ]
            },
            {"text": "Shipped."},
        ]
    )
    send_message(server, session_id, "Ask me")
    page.wait_for_selector(
        "#mcp-servers li[data-name='t'] .badge[data-mcp='ready']", timeout=90_000
    )
    assert "echo" in page.locator("#mcp-servers .mcp-tools").inner_text()

    card = page.wait_for_selector("#approvals li.approval", timeout=90_000)
    assert card.query_selector(".approval-message").inner_text() == "Ship?"
    page.locator("#approvals .mcp-form input[type=checkbox]").check()
    page.locator("#approvals .mcp-form input[type=text]").fill("from the page")
    page.locator("#approvals button.approve").click()
    page.wait_for_selector("#status[data-status=idle]", timeout=60_000)

    tool = page.locator("#transcript li.entry.tool").first
    assert tool.locator(".badge.mcp-server").inner_text() == "t"
    assert tool.locator(".tool-name").inner_text() == "confirm"
    tool.locator("summary").click()
    output = tool.locator(".call-output").inner_text()
    assert output == "accepted: confirm=True note=from the page"
    assert tool.locator(".call-images").is_hidden()

    # An MCP tool's image: a thumbnail under its output, the decoded PNG itself.
    pictured = page.locator("#transcript li.entry.tool").nth(1)
    assert pictured.locator(".tool-name").inner_text() == "image"
    pictured.locator("summary").click()
    image = pictured.locator(".call-images img.call-image")
    assert image.count() == 1
    assert image.get_attribute("src") == "data:image/png;base64," + base64.b64encode(
        PNG_1X1
    ).decode("ascii")
    assert image.evaluate("img => img.decode().then(() => img.naturalWidth)") == 1
    assert errors == []
    context.close()
