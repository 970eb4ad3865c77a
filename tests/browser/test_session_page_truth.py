"""The session page says what happened (issue 43, "It shows what is not true"): each
tool outcome its own status, tool cards keyed by turn, no stale "no runner" banner, no
change without a difference, removals drawn before additions. Real chromium, daphne,
runner and mock LLM, as in test_web_page.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session
from tests.browser.test_web_page import ALICE, OS_ENV, send, transcript_texts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def open_session(browser: Any, server: Server, session_id: str) -> tuple[Any, Any, list[str]]:
    """The session page signed in as Alice, with page errors and console errors kept."""
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    return context, page, errors


def write(call_id: str, path: str, content: str = "x\n") -> dict[str, Any]:
    return {
        "tool_calls": [
            {"call_id": call_id, "name": "sys_os_write",
             "arguments": {"path": path, "content": content}}
        ]
    }  # fmt: skip


def seconds(duration: str) -> int:
    """A card's duration ("<1 s", "3 s") in whole seconds."""
    return 0 if duration == "<1 s" else int(duration.removesuffix(" s"))


def card(page: Any, call_id: str, index: int = 0) -> Any:
    return page.locator(f"#transcript .entry.tool[data-call-id='{call_id}']").nth(index)


def test_declined_denied_and_failed_calls_each_show_their_own_status(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    rules = (
        "guardrails:\n  policies:\n"
        "    - {name: no-secrets, tools: [sys_os_write], when: {path: secret},"
        " action: deny, reason: keep out}\n"
        "    - {name: ask-notes, tools: [sys_os_write], when: {path: '^notes'}, action: ask}\n"
    )
    session_id = create_session(server, make_bundle("outcomes", extra=OS_ENV + rules))
    bind(server, session_id, runner.runner_id)
    mock_llm.configure(
        [
            write("c-ok", "ok.txt"),
            write("c-ask", "notes.txt"),
            write("c-deny", "secret.txt"),
            {"tool_calls": [{"call_id": "c-fail", "name": "sys_os_read",
                             "arguments": {"path": "missing.txt"}}]},
            {"text": "All four tried."},
        ]
    )  # fmt: skip
    context, page, errors = open_session(browser, server, session_id)
    send(page, "Try four things")
    question = page.wait_for_selector("#approvals li.approval")
    question.query_selector("input").fill("not now")
    question.query_selector("button.decline").click()
    page.wait_for_selector("#status[data-status=idle]")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .bubble')]"
        ".some(n => n.innerText.includes('All four tried.'))"
    )
    expected = {"c-ok": "completed", "c-ask": "declined", "c-deny": "denied", "c-fail": "failed"}

    def shown() -> dict[str, tuple[str, str]]:
        return {
            call_id: (
                card(page, call_id).locator(".call-status").inner_text(),
                card(page, call_id).locator(".call-status").get_attribute("data-status") or "",
            )
            for call_id in expected
        }

    assert shown() == {call_id: (status, status) for call_id, status in expected.items()}
    colours = {
        call_id: card(page, call_id)
        .locator(".call-status")
        .evaluate("n => getComputedStyle(n).color")
        for call_id in expected
    }
    assert len(set(colours.values())) == 4, colours
    # The stored transcript (a reload) says the same as the stream did.
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert shown() == {call_id: (status, status) for call_id, status in expected.items()}
    assert errors == [], errors
    context.close()


def test_a_call_id_reused_in_a_later_turn_gets_its_own_card(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """Some OpenAI-compatible servers number calls per answer (``call_0`` every time): the
    second turn's call waits for an approval and must not borrow the first one's result."""
    rules = (
        "guardrails:\n  policies:\n"
        "    - {name: ask-later, tools: [sys_os_write], when: {path: '^later'}, action: ask}\n"
    )
    session_id = create_session(server, make_bundle("reuse", extra=OS_ENV + rules))
    bind(server, session_id, runner.runner_id)
    mock_llm.configure(
        [
            write("call_0", "first.txt"),
            {"text": "First written."},
            write("call_0", "later.txt"),
            {"text": "Later written."},
        ]
    )
    context, page, errors = open_session(browser, server, session_id)
    send(page, "Write the first file")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .bubble')]"
        ".some(n => n.innerText.includes('First written.'))"
    )
    page.wait_for_selector("#status[data-status=idle]")
    started = time.monotonic()
    send(page, "Write the later file")
    page.wait_for_selector("#approvals li.approval")
    page.wait_for_function(
        "() => document.querySelectorAll(\"#transcript .entry.tool[data-call-id='call_0']\")"
        ".length === 2"
    )
    waiting = card(page, "call_0", 1)
    assert "later.txt" in waiting.locator(".call-args").text_content()
    assert waiting.locator(".call-status").inner_text() == "running"
    assert waiting.locator(".call-output").text_content() == ""
    assert waiting.locator(".call-duration").text_content() == ""
    first = card(page, "call_0", 0)
    assert first.locator(".call-status").inner_text() == "completed"
    assert "first.txt" in first.locator(".call-output").text_content()

    page.click("#approvals li.approval button.approve")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .bubble')]"
        ".some(n => n.innerText.includes('Later written.'))"
    )
    turn_s = time.monotonic() - started
    for reloaded in (False, True):
        if reloaded:
            page.reload()
            page.wait_for_selector("body[data-ready='1']")
        first, later = card(page, "call_0", 0), card(page, "call_0", 1)
        assert first.locator(".call-status").inner_text() == "completed"
        assert later.locator(".call-status").inner_text() == "completed"
        assert "first.txt" in first.locator(".call-output").text_content()
        assert "later.txt" in later.locator(".call-output").text_content()
        # Its own duration (the approval wait included, whole seconds), nothing that
        # spans the turns in between.
        assert seconds(later.locator(".call-duration").text_content()) <= turn_s + 1
    assert transcript_texts(page).count("Write the later file") == 1
    assert errors == [], errors
    context.close()


def test_no_runner_banner_goes_when_a_runner_is_bound_and_a_fork_asks_for_no_workspace(
    browser: Any, server: Server, runner: Runner, make_bundle: Callable[..., bytes]
) -> None:
    (runner.workspace / "readme.txt").write_text("hello\n")
    session_id = create_session(server, make_bundle("unbound", extra=OS_ENV), title="Unbound")
    context, page, errors = open_session(browser, server, session_id)
    conflicts: list[str] = []
    page.on("response", lambda r: conflicts.append(r.url) if r.status == 409 else None)
    # Nothing is asked of a workspace no runner serves: no 409, no error note.
    assert page.is_visible("#panel-workspace")
    assert "Bind a runner" in page.inner_text("#ws-note")
    assert page.locator("#ws-tree li").count() == 0
    assert errors == [], errors

    send(page, "Hello?")
    banner = page.wait_for_selector("#session-error:not([hidden])")
    assert "no runner is bound" in banner.inner_text()
    page.select_option("#runner-select", runner.runner_id)
    page.wait_for_selector("#runner-label:has-text('e2e online')")
    page.wait_for_selector("#session-error", state="hidden")
    page.wait_for_selector("#ws-tree button:has-text('readme.txt')")
    assert page.is_hidden("#ws-note")

    # A fork has no runner bound: its page does not ask for a workspace either.
    page.click("#fork")
    page.wait_for_url(lambda url: session_id not in url and "/s/conv_" in url)
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("#runner-label") == "no runner"
    assert "Bind a runner" in page.inner_text("#ws-note")
    assert page.is_hidden("#session-error")
    assert conflicts == [], conflicts
    assert not any("409" in error for error in errors), errors
    context.close()


def test_a_file_saved_with_identical_content_is_not_listed_as_changed(
    browser: Any, server: Server, runner: Runner, make_bundle: Callable[..., bytes]
) -> None:
    (runner.workspace / "same.txt").write_text("keep me\n")
    (runner.workspace / "other.txt").write_text("one\n")
    session_id = create_session(server, make_bundle("same", extra=OS_ENV))
    bind(server, session_id, runner.runner_id)
    context, page, errors = open_session(browser, server, session_id)
    page.click("#ws-tree button:has-text('same.txt')")
    page.wait_for_function("() => document.querySelector('#ws-path').textContent === 'same.txt'")
    page.click("#ws-save")
    page.wait_for_selector("#ws-save:has-text('Saved')")
    # A real change afterwards: once it is listed, the list is from after both saves.
    page.click("#ws-tree button:has-text('other.txt')")
    page.wait_for_function("() => document.querySelector('#ws-path').textContent === 'other.txt'")
    page.fill("#ws-content", "one\ntwo\n")
    page.click("#ws-save")
    page.wait_for_selector("#changes li[data-path='other.txt']")
    with server.client() as client:
        stored = client.get(
            f"/v1/sessions/{session_id}/resources/environments/default/changes"
        ).json()["data"]
    # The server keeps the record (agents.md's table: modified, then modified); the page
    # does not show a change with no difference.
    assert {entry["path"] for entry in stored} == {"same.txt", "other.txt"}
    assert page.locator("#changes li[data-path='same.txt']").count() == 0
    assert page.locator("#changes li").count() == 1
    assert page.is_hidden("#changes-empty")
    assert errors == [], errors
    context.close()


def test_the_diff_draws_removed_lines_before_added_ones(
    browser: Any, server: Server, runner: Runner, make_bundle: Callable[..., bytes]
) -> None:
    (runner.workspace / "lines.txt").write_text("a\nold\nc\n")
    session_id = create_session(server, make_bundle("lines", extra=OS_ENV))
    bind(server, session_id, runner.runner_id)
    context, page, errors = open_session(browser, server, session_id)
    page.click("#ws-tree button:has-text('lines.txt')")
    page.wait_for_function("() => document.querySelector('#ws-path').textContent === 'lines.txt'")
    page.fill("#ws-content", "a\nnew\nc\n")
    page.click("#ws-save")
    page.click("#changes li[data-path='lines.txt'] button")
    page.wait_for_selector("#diff tr.add")
    rows = page.eval_on_selector_all("#diff td.code", "ns => ns.map(n => n.textContent)")
    assert rows == [" a", "-old", "+new", " c"], rows
    assert errors == [], errors
    context.close()
