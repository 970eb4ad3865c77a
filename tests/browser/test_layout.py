"""Layout items of issue 43: every page fits a 390 px phone without horizontal
scrolling, Markdown tables are rendered (as text, never markup) and the pages follow the
system's dark mode. Real chromium, daphne, runner and mock LLM, as in test_web_page.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session
from tests.browser.test_web_page import ALICE, OS_ENV, XSS, send

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TABLE = (
    "Here is the plan:\n\n"
    "| Step | What | Cost |\n"
    "| :--- | :---: | ---: |\n"
    f"| 1 | **write** `hello.txt` | {XSS} |\n"
    "| 2 | a \\| pipe | 3 |\n"
)


def overflow(page: Any) -> int:
    """How many pixels the page is wider than its viewport (0: no horizontal scroll)."""
    return int(
        page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
    )


def a_session_with_a_table(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> str:
    session_id = create_session(server, make_bundle("layout", extra=OS_ENV), title="Layout")
    bind(server, session_id, runner.runner_id)
    mock_llm.configure(
        [
            {"tool_calls": [{"call_id": "c-1", "name": "sys_os_write", "arguments": {
                "path": "a-rather-long-folder-name/and-a-long-file-name-too.txt",
                "content": "x" * 300 + "\n"}}]},
            {"text": TABLE, "stream": True},
        ]
    )  # fmt: skip
    return session_id


def run_turn(page: Any) -> None:
    send(page, "Make a plan " + "with-a-very-long-unbroken-word" * 4)
    page.wait_for_selector("#transcript table")
    page.wait_for_selector("#status[data-status=idle]")


def test_every_page_fits_390_px_without_horizontal_scrolling(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = a_session_with_a_table(server, runner, mock_llm, make_bundle)
    phone = {"width": 390, "height": 844}
    anonymous = browser.new_context(viewport=phone)
    page = anonymous.new_page()
    page.goto(f"{server.url}/signin")
    page.wait_for_selector("#id_username")
    widths = {"signin": overflow(page)}
    anonymous.close()

    context = browser.new_context(viewport=phone, extra_http_headers={"X-Forwarded-Email": ALICE})
    page = context.new_page()
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#side-list li.side-row", state="attached")
    run_turn(page)
    page.click("#changes .change")
    page.wait_for_selector("#panel-diff:not([hidden])")
    widths["session"] = overflow(page)
    page.click("#share")
    page.wait_for_selector("#share-dialog[open]")
    widths["session-share"] = overflow(page)
    page.keyboard.press("Escape")
    # Unbound, the page offers the runner select (its option is the long runner id).
    unbound = create_session(server, make_bundle("unbound"), title="x" * 200)
    page.goto(f"{server.url}/s/{unbound}")
    page.wait_for_selector(
        "#runner-select:not([hidden]) option[value^=runner_token_]", state="attached"
    )
    widths["session-unbound"] = overflow(page)
    page.goto(f"{server.url}/")
    page.wait_for_selector(f"li.session-row[data-id='{session_id}']")
    widths["sessions"] = overflow(page)
    page.goto(f"{server.url}/?view=archived")
    page.wait_for_selector("body[data-view=archived]")
    widths["archived"] = overflow(page)
    page.goto(f"{server.url}/new")
    page.wait_for_selector("#runner option[value^=runner_token_]", state="attached")
    widths["new"] = overflow(page)
    page.goto(f"{server.url}/runners")
    page.wait_for_selector("#runner-rows tr")
    widths["runners"] = overflow(page)
    page.fill("#runner-name", "a-laptop-with-a-long-host-name.example.com")
    page.click("#register-form button[type=submit]")
    page.wait_for_selector("#registered:not([hidden])")
    widths["runners-registered"] = overflow(page)
    page.goto(f"{server.url}/webhooks")
    page.wait_for_selector("#webhook-events input[value='runner.offline']")
    widths["webhooks"] = overflow(page)
    context.close()
    assert widths == dict.fromkeys(widths, 0), widths


def test_a_markdown_table_is_rendered_and_its_cells_are_text(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = a_session_with_a_table(server, runner, mock_llm, make_bundle)
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    run_turn(page)
    for _ in range(2):  # streamed, then from the stored transcript
        table = page.locator("#transcript table")
        assert table.locator("th").all_inner_texts() == ["Step", "What", "Cost"]
        cells = [row.locator("td").all_inner_texts() for row in table.locator("tbody tr").all()]
        assert cells == [["1", "write hello.txt", XSS], ["2", "a | pipe", "3"]]
        assert table.locator("td strong").count() == 1 and table.locator("td code").count() == 1
        aligns = table.locator("th").evaluate_all("ns => ns.map(n => n.style.textAlign)")
        assert aligns == ["left", "center", "right"]
        assert "| Step" not in page.locator("#transcript").inner_text()  # no raw pipes
        assert page.locator("#transcript img").count() == 0
        assert page.evaluate("document.body.dataset.pwned") is None
        page.reload()
        page.wait_for_selector("#transcript table")
    context.close()


# Every visible piece of text on the page against the surface behind it: the worst
# contrast ratios (WCAG 2 relative luminance), so a colour that is unreadable in one mode
# fails the test wherever it is used.
LOW_CONTRAST = """(minimum) => {
  const rgba = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const c = [r, g, b].map((v) => {
      const s = v / 255;
      return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  };
  const backdrop = (node) => {
    for (let n = node; n; n = n.parentElement) {
      const bg = rgba(getComputedStyle(n).backgroundColor);
      if (bg.length === 3 || (bg.length === 4 && bg[3] > 0.5)) return bg;
    }
    return rgba(getComputedStyle(document.documentElement).backgroundColor);
  };
  const low = [];
  for (const node of document.querySelectorAll("body *")) {
    const own = [...node.childNodes].some((c) => c.nodeType === 3 && c.textContent.trim());
    const box = node.getBoundingClientRect();
    if (!own || box.width < 2 || box.height < 2 || node.closest("[hidden], :disabled")) continue;
    const fg = lum(rgba(getComputedStyle(node).color));
    const bg = lum(backdrop(node));
    const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
    if (ratio < minimum) {
      low.push(`${node.tagName}.${node.className} "${node.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}`);
    }
  }
  return low;
}"""


def colours(page: Any) -> tuple[str, str]:
    return page.evaluate(
        "() => { const s = getComputedStyle(document.body); return [s.backgroundColor, s.color]; }"
    )


def test_dark_mode_follows_the_system_setting_and_every_page_stays_readable(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = a_session_with_a_table(server, runner, mock_llm, make_bundle)
    seen: dict[str, dict[str, tuple[str, str]]] = {"light": {}, "dark": {}}
    low: dict[str, list[str]] = {}
    for scheme in ("dark", "light"):
        anonymous = browser.new_context(color_scheme=scheme)
        page = anonymous.new_page()
        page.goto(f"{server.url}/signin")
        page.wait_for_selector("#id_username")
        seen[scheme]["signin"] = colours(page)
        low[f"{scheme} signin"] = page.evaluate(LOW_CONTRAST, 4.5)
        anonymous.close()
        context = browser.new_context(
            color_scheme=scheme,
            viewport={"width": 1400, "height": 900},
            extra_http_headers={"X-Forwarded-Email": ALICE},
        )
        page = context.new_page()
        page.goto(f"{server.url}/s/{session_id}")
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("#side-list li.side-row")  # the sidebar is read too
        if scheme == "dark":
            run_turn(page)
        page.wait_for_selector("#transcript table")
        page.click("#changes .change")
        page.wait_for_selector("#panel-diff:not([hidden])")
        page.click("#share")
        page.wait_for_selector("#share-dialog[open]")
        low[f"{scheme} share"] = page.evaluate(LOW_CONTRAST, 4.5)
        page.keyboard.press("Escape")
        pages = [
            ("session", None, ""),
            ("sessions", "/", "li.session-row"),
            ("archived", "/?view=archived", "body[data-view=archived]"),
            ("new", "/new", "#runner option[value^=runner_token_]"),
            ("runners", "/runners", "#runner-rows tr"),
            ("webhooks", "/webhooks", "#webhook-events input[value='runner.offline']"),
        ]
        for name, path, ready in pages:
            if path:
                page.goto(f"{server.url}{path}")
                page.wait_for_selector(ready, state="attached")
            seen[scheme][name] = colours(page)
            low[f"{scheme} {name}"] = page.evaluate(LOW_CONTRAST, 4.5)
        context.close()
    for name, (background, text) in seen["dark"].items():
        assert (background, text) != seen["light"][name], name
    assert low == dict.fromkeys(low, []), low
