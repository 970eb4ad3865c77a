"""An approval at the foot of a long session cannot be missed (issue 43): the card is
brought into view clear of the sticky composer, the tab title counts the questions
waiting, a keyboard-only answer keeps focus on the page (never <body>), and each call
records who answered it, live and after a reload.

A real daphne, runner and mock LLM behind Debian's chromium, as in test_web_page.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, send_message
from tests.browser.test_web_page import ALICE, OS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Where the card is, against the viewport and the sticky composer's top edge.
CARD_BOX = """() => {
  const card = document.querySelector('#approvals li.approval');
  const composer = document.getElementById('composer').getBoundingClientRect();
  const box = card.getBoundingClientRect();
  return {top: box.top, bottom: box.bottom, composerTop: composer.top};
}"""


# True once the call cards' "approved by …" records read `expected`, in order.
VERDICTS_ARE = """expected => JSON.stringify(
  [...document.querySelectorAll('#transcript .call-verdict')].map(n => n.textContent)
) === JSON.stringify(expected)"""


def long_guarded_session(server: Server, make_bundle: Callable[..., bytes]) -> str:
    """A session whose 60 earlier items push the foot of the conversation far below the fold."""
    bundle = make_bundle("guarded", extra=OS_ENV + "guardrails:\n  ask_on_os_tools: true\n")
    items = []
    for index in range(30):
        items.append({"type": "message", "role": "user", "content": f"question {index}"})
        items.append(
            {"type": "message", "role": "assistant", "content": f"answer {index}\n\n- a\n- b\n"}
        )
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", bundle, "application/gzip")}
        ).json()["id"]
        created = client.post(
            "/v1/sessions",
            json={"agent_id": agent, "title": "Long guarded", "initial_items": items},
        )
        assert created.status_code == 201, created.text
        return str(created.json()["id"])


def write_call(call_id: str, path: str) -> dict[str, Any]:
    return {
        "tool_calls": [
            {"call_id": call_id, "name": "sys_os_write",
             "arguments": {"path": path, "content": "x\n"}}
        ]
    }  # fmt: skip


@pytest.mark.parametrize("width,height", [(1400, 900), (390, 844)])
def test_a_question_below_the_fold_is_shown_and_counted_in_the_title(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    width: int,
    height: int,
) -> None:
    session_id = long_guarded_session(server, make_bundle)
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(
        viewport={"width": width, "height": height},
        extra_http_headers={"X-Forwarded-Email": ALICE},
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    assert not page.title().startswith("(")
    # The reader is up in the history when the question arrives (sent from another client).
    page.evaluate("window.scrollTo(0, 0)")
    mock_llm.configure([write_call("c1", "one.txt"), {"text": "Done."}])
    send_message(server, session_id, "Write a file")
    page.wait_for_selector("#approvals li.approval")
    page.wait_for_function("() => document.title.startsWith('(1) ')")
    box = page.wait_for_function(
        f"() => {{ const b = ({CARD_BOX})(); return b.top >= 0 && b.bottom <= b.composerTop && b; }}"
    ).json_value()
    assert box["bottom"] <= box["composerTop"], box
    page.locator("#approvals button.approve").click()
    page.wait_for_selector("#status[data-status=idle]")
    page.wait_for_function("() => !document.title.startsWith('(')")
    assert errors == []
    context.close()


def test_keyboard_only_answers_keep_focus_on_the_page(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = long_guarded_session(server, make_bundle)
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    mock_llm.configure(
        [write_call("c1", "one.txt"), write_call("c2", "two.txt"), {"text": "Done."}]
    )
    send_message(server, session_id, "Write two files")
    page.wait_for_selector("#approvals li.approval")
    # Tab from the reason box to Approve, press Enter: keyboard only.
    page.focus("#approvals li.approval input")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Approve"
    # The focused button is not hidden behind the sticky composer.
    covered = page.evaluate(
        """() => document.activeElement.getBoundingClientRect().bottom
                 > document.getElementById('composer').getBoundingClientRect().top"""
    )
    assert not covered
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#approvals li.approval')]"
        ".some(n => n.innerText.includes('two.txt'))"
    )
    focused = page.evaluate("document.activeElement.id || document.activeElement.tagName")
    assert focused != "BODY", focused
    # Second question: Shift+Tab back from Decline's neighbour is not needed; reach Decline.
    page.focus("#approvals li.approval input")
    page.keyboard.type("not now")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Decline"
    page.keyboard.press("Enter")
    page.wait_for_selector("#status[data-status=idle]")
    focused = page.evaluate("document.activeElement.id || document.activeElement.tagName")
    assert focused != "BODY", focused
    # Each call records who answered, live and after a reload.
    expected = [f"approved by {ALICE}", f"declined by {ALICE}: not now"]
    page.wait_for_function(VERDICTS_ARE, arg=expected)
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function(VERDICTS_ARE, arg=expected)
    # At 390 px the record stays inside its card.
    spill = page.eval_on_selector_all(
        "#transcript li.tool",
        """ns => ns.map(n => n.querySelector('.call-verdict').getBoundingClientRect().right
                           - n.getBoundingClientRect().right)""",
    )
    assert all(over <= 0 for over in spill), spill
    context.close()
