"""The session page's sidebar and the sessions list's Archived view (issue 43, "Everyday
conveniences"; issue 41, "no archived view"), in real chromium against a real daphne,
runner and mock LLM: the user's sessions live, search, "waiting for you" counts, pin,
archive and unarchive, delete with a confirmation, and the sidebar folded at 390 px with
nothing scrolling sideways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message, wait_until
from tests.browser.test_inbox import ASK
from tests.browser.test_layout import overflow
from tests.browser.test_session_page_truth import write
from tests.browser.test_web_page import ALICE, OS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def side_ids(page: Any) -> list[str]:
    return list(
        page.eval_on_selector_all("#side-list li.side-row", "ns => ns.map(n => n.dataset.id)")
    )


def menu_action(page: Any, session_id: str, action: str) -> None:
    row = page.locator(f"#side-list li.side-row[data-id='{session_id}']")
    row.locator("button.menu-button").click()
    row.locator(f"button.menu-item[data-action={action}]").click()


def agent_with_items(server: Server, make_bundle: Callable[..., bytes]) -> tuple[str, str]:
    """A template agent and a session whose transcript holds a word to search for."""
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", make_bundle("s"), "application/gzip")}
        ).json()["id"]
        items = [
            {"type": "message", "role": "user", "content": "why did the call fail?"},
            {"type": "message", "role": "assistant", "content": "The Gateway timed out."},
        ]
        found = client.post(
            "/v1/sessions", json={"agent_id": agent, "title": "Found", "initial_items": items}
        ).json()["id"]
    return agent, found


def test_the_sidebar_is_live_searches_counts_pins_archives_and_deletes(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    agent, found = agent_with_items(server, make_bundle)
    asks = create_session(server, make_bundle("asks", extra=OS_ENV + ASK), title="Asks")
    bind(server, asks, runner.runner_id)
    with server.client() as client:

        def new(title: str) -> str:
            made = client.post("/v1/sessions", json={"agent_id": agent, "title": title})
            return str(made.json()["id"])

        older, current = new("Older"), new("Current")
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/s/{current}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#sidebar[data-ready='1']")
    # Newest activity first; the open session is marked; nothing is folded at 1,400 px.
    assert side_ids(page) == [current, older, asks, found]
    assert page.get_attribute(f"li[data-id='{current}'] a", "aria-current") == "page"
    assert page.is_visible("#side-list") and page.is_hidden("#side-toggle")

    # Live: a session made elsewhere appears, a rename shows, without a reload.
    with server.client() as client:
        made = client.post("/v1/sessions", json={"agent_id": agent, "title": "Made elsewhere"})
        live = made.json()["id"]
        client.patch(f"/v1/sessions/{older}", json={"title": "Older, renamed"})
    page.wait_for_selector(f"#side-list li.side-row[data-id='{live}']")
    page.wait_for_function(
        f"() => document.querySelector(\"li[data-id='{older}'] .side-title\")"
        ".textContent === 'Older, renamed'"
    )
    assert side_ids(page) == [older, live, current, asks, found]  # the newest change first

    # Waiting for you: a question raised in another session is counted on its row.
    mock_llm.configure([write("c-1", "notes.txt"), {"text": "Written."}])
    send_message(server, asks, "Write the notes")
    count = page.wait_for_selector(f"li[data-id='{asks}'] .side-count")
    assert count.inner_text() == "1"
    assert page.inner_text("#side-waiting") == "1 waiting for you"

    # Search asks the server (what was said, not only titles); clearing brings the list back.
    page.locator("#side-search").press_sequentially("gatew", delay=30)
    page.wait_for_selector("#sidebar[data-searched='gatew']")
    assert side_ids(page) == [found]
    assert "Gateway timed out" in page.inner_text(f"li[data-id='{found}'] .side-snippet")
    assert "#item-" in page.get_attribute(f"li[data-id='{found}'] a", "href")
    page.fill("#side-search", "")
    page.wait_for_function(
        "n => document.querySelectorAll('#side-list li.side-row').length === n", arg=5
    )

    # Pin: first under "Pinned", kept by the server (after a reload too), by keyboard.
    row = page.locator(f"li.side-row[data-id='{found}']")
    row.locator("button.menu-button").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.dataset.action") == "pin"
    page.keyboard.press("Escape")
    assert page.evaluate("document.activeElement.classList.contains('menu-button')")
    assert page.is_hidden(f"li[data-id='{found}'] .menu")
    menu_action(page, found, "pin")
    page.wait_for_selector(f"li.side-row[data-id='{found}'][data-pinned='1']")
    assert side_ids(page)[0] == found
    assert page.eval_on_selector_all(
        "#side-list li.side-group", "ns => ns.map(n => n.textContent)"
    ) == ["Pinned", "Recent"]
    with server.client() as client:
        rows = {r["id"]: r for r in client.get("/v1/sessions?limit=100").json()["data"]}
    assert rows[found]["pinned"] is True and rows[live]["pinned"] is False
    page.reload()
    page.wait_for_selector("#sidebar[data-ready='1']")
    assert side_ids(page)[0] == found

    # Archive: the row goes (Undo brings it back); the Archived view lists it and unarchives.
    menu_action(page, older, "archive")
    page.wait_for_selector(f"li.side-row[data-id='{older}']", state="detached")
    page.click("#side-undo")
    page.wait_for_selector(f"li.side-row[data-id='{older}']")
    menu_action(page, older, "archive")
    page.wait_for_selector(f"li.side-row[data-id='{older}']", state="detached")
    with server.client() as client:
        wait_until(
            lambda: client.get(f"/v1/sessions/{older}?include_items=false").json()["archived"],
            deadline_s=10,
            what="the session to be archived",
        )
    page.click("#side-note a[href='/?view=archived']")
    page.wait_for_selector("body[data-view=archived]")
    assert page.input_value("#view-filter") == "archived"
    assert page.eval_on_selector_all(
        "#session-list li.session-row", "ns => ns.map(n => n.dataset.id)"
    ) == [older]
    archived_row = page.locator(f"#session-list li[data-id='{older}']")
    archived_row.locator("button.menu-button").click()
    archived_row.locator("button.menu-item[data-action=unarchive]").click()
    page.wait_for_selector("#empty-archived:not([hidden])")
    page.select_option("#view-filter", "")
    page.wait_for_selector(f"#session-list li[data-id='{older}']")
    assert "view=archived" not in page.url
    with server.client() as client:
        assert client.get(f"/v1/sessions/{older}").json()["archived"] is False

    # Delete: Cancel keeps it; Delete removes it for good; deleting the open session
    # leaves its page for the list.
    page.goto(f"{server.url}/s/{current}")
    page.wait_for_selector("#sidebar[data-ready='1']")
    menu_action(page, live, "delete")
    page.wait_for_selector("#delete-dialog[open]")
    assert "Made elsewhere" in page.inner_text("#delete-what")
    page.click("#delete-cancel")
    assert page.is_visible(f"li.side-row[data-id='{live}']")
    menu_action(page, live, "delete")
    page.click("#delete-confirm")
    page.wait_for_selector(f"li.side-row[data-id='{live}']", state="detached")
    with server.client() as client:
        assert client.get(f"/v1/sessions/{live}").status_code == 404
    menu_action(page, current, "delete")
    page.click("#delete-confirm")
    page.wait_for_url(f"{server.url}/")
    page.wait_for_selector("#session-list li.session-row")
    assert current not in page.eval_on_selector_all(
        "#session-list li.session-row", "ns => ns.map(n => n.dataset.id)"
    )
    assert errors == [], errors
    context.close()


def test_the_sidebar_folds_at_390_px_without_scrolling_sideways(
    browser: Any, server: Server, make_bundle: Callable[..., bytes]
) -> None:
    agent, found = agent_with_items(server, make_bundle)
    long_title = "A rather long session title that would never fit beside the menu " * 2
    with server.client() as client:
        current = client.post("/v1/sessions", json={"agent_id": agent, "title": long_title}).json()[
            "id"
        ]
        client.patch(f"/v1/sessions/{found}", json={"archived": True})
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    page.goto(f"{server.url}/s/{current}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#sidebar[data-ready='1']")
    # Folded: only the toggle shows, the conversation starts right below it.
    assert page.is_visible("#side-toggle") and page.is_hidden("#side-list")
    assert page.get_attribute("#side-toggle", "aria-expanded") == "false"
    assert overflow(page) == 0
    page.click("#side-toggle")
    assert page.is_visible("#side-list")
    assert page.get_attribute("#side-toggle", "aria-expanded") == "true"
    assert side_ids(page) == [current]  # the archived one is not listed
    assert overflow(page) == 0
    page.locator(f"li[data-id='{current}'] button.menu-button").click()
    assert page.is_visible(f"li[data-id='{current}'] .menu")
    assert overflow(page) == 0
    page.keyboard.press("Escape")

    # The Archived view of the list, at 390 px, with its menu open.
    page.goto(f"{server.url}/?view=archived")
    page.wait_for_selector(f"#session-list li[data-id='{found}']")
    page.locator(f"#session-list li[data-id='{found}'] button.menu-button").click()
    assert overflow(page) == 0
    context.close()
