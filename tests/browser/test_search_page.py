"""The session list's search and the session page's export and import in a real browser
(lifecycle.md: the list searches as you type and opens the session at the match)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.processes import Server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE = "alice@example.com"


def test_search_as_you_type_opens_the_match_then_export_and_import(
    browser: Any, server: Server, make_bundle: Callable[..., bytes], tmp_path: Any
) -> None:
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", make_bundle("s"), "application/gzip")}
        ).json()["id"]
        items = [
            {"type": "message", "role": "user", "content": f"question number {index}"}
            for index in range(150)
        ]
        items[120] = {
            "id": "item_the_match",
            "type": "message",
            "role": "assistant",
            "content": "The Gateway timed out after 30 s; retry with a longer deadline.",
        }
        long_one = client.post(
            "/v1/sessions", json={"agent_id": agent, "title": "Long", "initial_items": items}
        ).json()["id"]
        client.post(
            "/v1/sessions",
            json={"agent_id": agent, "title": "Other", "initial_items": [items[0]]},
        )
    context = browser.new_context(
        viewport={"width": 1200, "height": 800},
        extra_http_headers={"X-Forwarded-Email": ALICE},
    )
    page = context.new_page()
    searches: list[str] = []
    page.on("request", lambda r: searches.append(r.url) if "search_query=" in r.url else None)
    page.goto(f"{server.url}/")
    page.wait_for_selector("#session-list li")
    page.locator("#search").press_sequentially("gatew", delay=40)
    page.wait_for_selector("body[data-searched='gatew']")
    assert len(searches) == 1, searches  # debounced: one request for five keys
    rows = page.locator("#session-list li")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-id") == long_one
    assert page.inner_text("#session-list mark") == "Gateway"
    # Nothing found: a note, no rows.
    page.fill("#search", "zzzz")
    page.wait_for_selector("body[data-searched='zzzz']")
    assert page.locator("#session-list li").count() == 0
    assert "zzzz" in page.inner_text("#search-note")
    page.fill("#search", "gateway")
    page.wait_for_selector("body[data-searched='gateway']")

    page.click("#session-list a")
    page.wait_for_url(f"**/s/{long_one}#item-item_the_match")
    page.wait_for_selector("body[data-ready='1']")
    hit = page.locator("#transcript .search-hit")
    assert hit.count() == 1 and "Gateway timed out" in hit.inner_text()
    box, viewport = hit.bounding_box(), page.viewport_size
    assert box is not None and viewport is not None
    assert 0 <= box["y"] and box["y"] + box["height"] <= viewport["height"], box

    href = page.get_attribute("#export", "href")
    assert href == f"/v1/sessions/{long_one}/export?files=1"
    assert page.get_attribute("#export", "download") is not None
    exported = tmp_path / "export.jsonl"
    exported.write_bytes(page.request.get(f"{server.url}{href}").body())
    assert exported.read_bytes().count(b"\n") == 1 + 150

    page.goto(f"{server.url}/")
    page.set_input_files("#import-file", str(exported))
    page.click("#import-submit")
    page.wait_for_url(lambda url: "/s/conv_" in url and long_one not in url)
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#transcript > li").count() == 150
    context.close()
