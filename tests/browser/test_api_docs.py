"""The API's documentation pages in a real browser: Swagger UI (``/v1/docs``) and Redoc
(``/v1/redoc``) draw the schema, and nothing they load comes from another origin (no
CDN, no web fonts), so they work offline (docs/deployment.md). Redoc's bundle asks for
the Redocly logo from Redocly's CDN: the page's Content-Security-Policy stops that in
the browser, before any request leaves it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from testing.processes import Server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE = "alice@example.com"
TITLE = "Omnigent session server API"


@pytest.mark.parametrize(
    ("path", "drawn"),
    [
        ("/v1/docs", ".swagger-ui .info .title"),
        ("/v1/redoc", "redoc h1"),
    ],
)
def test_the_api_docs_load_nothing_from_another_origin(
    browser: Any, server: Server, path: str, drawn: str
) -> None:
    context = browser.new_context(extra_http_headers={"X-Forwarded-Email": ALICE})
    page = context.new_page()
    requested: list[str] = []
    blocked: list[str] = []  # stopped by the page's policy: never sent
    page.on("request", lambda request: requested.append(request.url))
    page.on(
        "requestfailed",
        lambda request: blocked.append(request.url) if request.failure == "csp" else None,
    )
    try:
        page.goto(f"{server.url}{path}")
        title = page.wait_for_selector(drawn, timeout=30000)
        assert title is not None and TITLE in title.inner_text()
        page.wait_for_load_state("networkidle")
    finally:
        context.close()
    origin = urlsplit(server.url).netloc
    assert any("/v1/schema" in url for url in requested), requested
    outside = [url for url in requested if urlsplit(url).scheme in ("http", "https")]
    outside = [url for url in outside if urlsplit(url).netloc != origin and url not in blocked]
    assert outside == [], outside
