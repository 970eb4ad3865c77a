"""The sessions list marks the sessions the user pinned (docs/web.md, Sessions and Pins),
in real chromium against a real daphne: the word "Pinned" on the pinned row only (in
the row link's accessible name too), following pins and unpins made in the session
page's sidebar, in the list's own menu and through the API, live; another user's pin
is theirs alone; the marker stays readable in light and dark mode and fits 390 px."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from testing.processes import Server
from tests.browser.test_layout import LOW_CONTRAST, overflow
from tests.browser.test_sidebar import menu_action
from tests.browser.test_web_page import ALICE, BOB

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def marks(page: Any) -> dict[str, str]:
    """Session id → the text of its row's pinned marker, for the rows that have one."""
    return dict(
        page.eval_on_selector_all(
            "#session-list li.session-row",
            "ns => ns.filter(n => n.querySelector('.pinned-mark'))"
            ".map(n => [n.dataset.id, n.querySelector('.pinned-mark').textContent])",
        )
    )


def test_the_list_marks_pinned_sessions_and_follows_pins_made_elsewhere(
    browser: Any, server: Server, make_bundle: Callable[..., bytes]
) -> None:
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", make_bundle("p"), "application/gzip")}
        ).json()["id"]

        def new(title: str) -> str:
            return str(
                client.post("/v1/sessions", json={"agent_id": agent, "title": title}).json()["id"]
            )

        kept, plain = new("Keep this one"), new("An ordinary one")
        assert client.put(f"/v1/sessions/{kept}/pin").json()["pinned"] is True
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    errors: list[str] = []
    list_page = context.new_page()
    list_page.on("pageerror", lambda error: errors.append(str(error)))
    list_page.goto(f"{server.url}/")
    list_page.wait_for_selector(f"#session-list li.session-row[data-id='{plain}']")
    list_page.wait_for_selector(f"#session-list li.session-row[data-id='{kept}']")
    assert marks(list_page) == {kept: "Pinned"}
    # Said in words, so a screen reader hears it with the link, not only seen.
    named = list_page.get_by_role("link", name=re.compile(r"\bPinned\b"))
    assert named.count() == 1
    assert named.get_attribute("href") == f"/s/{kept}"
    list_page.evaluate("window.notReloaded = true")

    # Pinned in the session page's sidebar (another tab): the list follows, live.
    session_page = context.new_page()
    session_page.on("pageerror", lambda error: errors.append(str(error)))
    session_page.goto(f"{server.url}/s/{plain}")
    session_page.wait_for_selector("#sidebar[data-ready='1']")
    menu_action(session_page, plain, "pin")
    list_page.wait_for_selector(f"#session-list li[data-id='{plain}'] .pinned-mark")
    assert marks(list_page) == {kept: "Pinned", plain: "Pinned"}

    # Unpinned in the list's own menu: the marker goes at once, and the sidebar follows.
    row = list_page.locator(f"#session-list li[data-id='{kept}']")
    row.locator("button.menu-button").click()
    row.locator("button.menu-item[data-action=unpin]").click()
    list_page.wait_for_selector(
        f"#session-list li[data-id='{kept}'] .pinned-mark", state="detached"
    )
    session_page.wait_for_selector(f"#side-list li.side-row[data-id='{kept}'][data-pinned='0']")

    # Unpinned through the API: live as well.
    with server.client() as client:
        assert client.delete(f"/v1/sessions/{plain}/pin").json()["pinned"] is False
    list_page.wait_for_selector(
        f"#session-list li[data-id='{plain}'] .pinned-mark", state="detached"
    )
    assert marks(list_page) == {}

    # Bob's pin is his: Alice's list gets no marker. A rename of the same session after
    # it is the point by which the list has heard everything before it.
    with server.client() as client:
        granted = client.put(f"/v1/sessions/{plain}/permissions", json={"user_id": BOB, "level": 1})
        assert granted.status_code == 200, granted.text
    with server.client(BOB) as client:
        assert client.put(f"/v1/sessions/{plain}/pin").json()["pinned"] is True
    with server.client() as client:
        client.patch(f"/v1/sessions/{plain}", json={"title": "An ordinary one, renamed"})
    list_page.wait_for_function(
        f"() => document.querySelector(\"li[data-id='{plain}'] .row-title\")"
        ".textContent === 'An ordinary one, renamed'"
    )
    assert marks(list_page) == {}
    assert list_page.evaluate("window.notReloaded") is True  # all of it without a reload
    context.close()
    assert errors == [], errors


def test_the_pinned_marker_is_readable_in_both_modes_and_fits_a_phone(
    browser: Any, server: Server, make_bundle: Callable[..., bytes]
) -> None:
    long_title = "A rather long session title that would never fit beside the marker " * 2
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", make_bundle("p"), "application/gzip")}
        ).json()["id"]
        kept = client.post("/v1/sessions", json={"agent_id": agent, "title": long_title}).json()[
            "id"
        ]
        client.post("/v1/sessions", json={"agent_id": agent, "title": "Not pinned"})
        assert client.put(f"/v1/sessions/{kept}/pin").json()["pinned"] is True
    low: dict[str, list[str]] = {}
    for scheme in ("light", "dark"):
        for width, height in ((1400, 900), (390, 844)):
            context = browser.new_context(
                color_scheme=scheme,
                viewport={"width": width, "height": height},
                extra_http_headers={"X-Forwarded-Email": ALICE},
            )
            page = context.new_page()
            page.goto(f"{server.url}/")
            mark = page.wait_for_selector(f"#session-list li[data-id='{kept}'] .pinned-mark")
            box = mark.bounding_box()
            # Shown whole beside the shortened title, not pushed out of the row.
            assert box is not None and 0 < box["x"] and box["x"] + box["width"] <= width, box
            assert overflow(page) == 0
            low[f"{scheme} {width}"] = page.evaluate(LOW_CONTRAST, 4.5)
            context.close()
    assert low == dict.fromkeys(low, []), low
