"""The inbox (issue 43, "The agent needs you"): what waits for the user across sessions,
counted in every page's header and listed on /inbox, and an opt-in browser notification
when a question arrives while the tab is hidden (Playwright grants the permission).
Real chromium, daphne, runner and mock LLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message
from tests.browser.test_session_page_truth import write
from tests.browser.test_web_page import ALICE, OS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# The page believes its tab is hidden, and every notification it makes is recorded.
HIDDEN_TAB = """
Object.defineProperty(document, "hidden", { get: () => true, configurable: true });
window.__notes = [];
window.Notification = new Proxy(window.Notification, {
  construct(target, args) {
    window.__notes.push({ title: args[0], body: args[1]?.body ?? "" });
    return new target(...args);
  },
});
"""
ASK = "guardrails:\n  policies:\n    - {name: ask-notes, tools: [sys_os_write], action: ask}\n"


def test_a_question_is_counted_listed_and_notified_while_the_tab_is_hidden(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = create_session(server, make_bundle("asks", extra=OS_ENV + ASK), title="Asks")
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    context.grant_permissions(["notifications"], origin=server.url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # Opt in on the inbox page (nothing waits yet).
    page.goto(f"{server.url}/inbox")
    page.wait_for_selector("#inbox-empty:not([hidden])")
    assert page.is_hidden("#inbox-count")
    page.click("#notify")
    page.wait_for_selector("#notify[aria-pressed=true]")

    context.add_init_script(HIDDEN_TAB)
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    mock_llm.configure([write("c-1", "notes.txt"), {"text": "Written."}])
    send_message(server, session_id, "Write the notes")
    page.wait_for_selector("#approvals li.approval")
    page.wait_for_function("() => window.__notes.length === 1")
    note = page.evaluate("window.__notes[0]")
    assert note["title"] == "A question is waiting"
    assert note["body"].startswith("Asks: ")
    page.wait_for_selector("#inbox-count:not([hidden])")
    assert page.inner_text("#inbox-count") == "1"

    # Any page: the header counts it, the inbox lists it and links to the session.
    page.goto(f"{server.url}/runners")
    page.wait_for_selector("#inbox-count:not([hidden])")
    page.click("#inbox-link")
    row = page.wait_for_selector("#inbox-list li[data-kind=approval]")
    assert "Asks" in row.inner_text()
    row.query_selector("a").click()
    page.wait_for_url(f"**/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    page.click("#approvals li.approval button.approve")
    page.wait_for_selector("#inbox-count", state="hidden")
    assert errors == [], errors
    context.close()
