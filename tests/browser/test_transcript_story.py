"""The transcript says what happened (issue 43): a working line while a turn runs with
nothing streamed yet, a message sent during a turn marked "queued", "Stopped by you" and
a failed turn's error (live and after a reload), timestamps, Copy on messages and code
blocks, and attachment chips before sending. Real chromium, daphne, runner and mock LLM."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session
from tests.browser.test_session_page_truth import open_session
from tests.browser.test_web_page import send

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# A 1x1 PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def entry(page: Any, text: str) -> Any:
    return page.locator("#transcript li.entry", has=page.locator(".bubble", has_text=text))


def test_stop_queue_failure_times_copy_and_chips(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    session_id = create_session(server, make_bundle(), title="story")
    bind(server, session_id, runner.runner_id)
    mock_llm.configure(
        [
            {"text": "too slow to finish", "stream": True, "delay_s": 8},
            {"text": "Here it is:\n\n```\nprint(1)\n```\n"},
            {"error": {"status_code": 400, "message": "mock refused"}},
        ]
    )
    context, page, errors = open_session(browser, server, session_id)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)

    # Nothing streamed yet: the page says the agent is working.
    send(page, "first")
    page.wait_for_selector("#working:not([hidden])")
    assert page.inner_text("#working") == "Working…"
    # A message sent meanwhile waits for that turn.
    send(page, "second")
    entry(page, "second").locator(".queued-note").wait_for()
    assert entry(page, "second").locator(".queued-note").inner_text() == "queued"
    page.click("#stop")
    stopped = page.locator("#transcript li[data-trace=stopped]")
    stopped.wait_for()
    assert stopped.inner_text() == "Stopped by you"
    # The queued message's turn starts: no longer queued; its answer has a code block.
    page.locator("#transcript .code-box pre", has_text="print(1)").wait_for()
    assert entry(page, "second").locator(".queued-note").count() == 0
    page.wait_for_selector("#status[data-status=idle]")
    assert page.is_hidden("#working")

    # Timestamps: relative, the exact time on hover; Copy on a message and on code.
    when = entry(page, "first").locator("time")
    assert when.inner_text() == "just now"
    assert when.get_attribute("title") and when.get_attribute("datetime")
    page.locator("#transcript .code-box button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == "print(1)"
    entry(page, "first").locator("button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == "first"

    # A failed turn says why.
    send(page, "third")
    failed = page.locator("#transcript li[data-trace=failed]")
    failed.wait_for(timeout=30000)
    assert failed.inner_text().startswith("Failed: ")

    # After a reload the stored turns say the same (who stopped is not stored).
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.locator("#transcript li[data-trace=stopped]").wait_for()
    assert page.locator("#transcript li[data-trace=stopped]").inner_text() == "Stopped"
    assert page.locator("#transcript li[data-trace=failed]").count() == 1
    order = page.eval_on_selector_all(
        "#transcript > li", "ns => ns.map(n => n.dataset.trace || n.innerText.split('\\n').pop())"
    )
    assert order.index("stopped") == order.index("first") + 1, order

    # Attachments before sending: a chip each (name, size, thumbnail), removable.
    image, notes = tmp_path / "pixel.png", tmp_path / "notes.txt"
    image.write_bytes(PIXEL)
    notes.write_text("n" * 2048)
    page.set_input_files("#attach", [str(image), str(notes)])
    chips = page.locator("#chips li.chip")
    assert chips.count() == 2
    assert chips.nth(1).locator(".chip-size").inner_text() == "2.0 KB"
    page.wait_for_function(
        "() => document.querySelector('#chips img.thumb')?.src.startsWith('data:image/png')"
    )
    page.click("button[aria-label='Remove notes.txt']")
    assert page.locator("#chips .chip-name").all_inner_texts() == ["pixel.png"]
    assert errors == [], errors
    context.close()
