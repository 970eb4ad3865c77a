"""The web pages as HTTP responses: who gets in, the headers, no inline script.

What the pages do in a browser is tested in tests/browser/test_web_page.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.test import Client

from web.security import CONTENT_SECURITY_POLICY

from .conftest import ALICE

pytestmark = pytest.mark.django_db

PAGES = ["/", "/new", "/s/conv_anything", "/runners", "/webhooks", "/schedules"]
STATIC = Path(__file__).resolve().parents[2] / "web" / "static" / "web"


@pytest.mark.parametrize("path", PAGES)
def test_without_identity_a_page_asks_for_a_sign_in(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/signin?next=")


@pytest.mark.parametrize("path", PAGES)
def test_a_page_behind_the_proxy_header_has_a_strict_policy_and_no_inline_script(
    path: str,
) -> None:
    response = Client(headers={"X-Forwarded-Email": ALICE}).get(path)
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    html = response.content.decode()
    # Every <script> either loads a module from the app or is a JSON data block.
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'src="/static/' in tag or 'type="application/json"' in tag, tag
    assert " style=" not in html and "<style" not in html
    assert ALICE in html  # the user's name in the header
    assert "Sign out" not in html  # identity from the proxy: nothing to sign out of
    assert response["X-Content-Type-Options"] == "nosniff"


def test_sign_in_and_out_with_a_django_user() -> None:
    get_user_model().objects.create_user("dana", password="pw-dana")
    client = Client(enforce_csrf_checks=True)
    page = client.get("/signin?next=/runners")
    assert page.status_code == 200
    assert page["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    token = page.cookies["csrftoken"].value
    wrong = client.post(
        "/signin", {"username": "dana", "password": "nope", "csrfmiddlewaretoken": token}
    )
    assert wrong.status_code == 200 and b"Wrong user name or password" in wrong.content
    signed = client.post(
        "/signin",
        {
            "username": "dana",
            "password": "pw-dana",
            "next": "/runners",
            "csrfmiddlewaretoken": token,
        },
    )
    assert signed.status_code == 302 and signed["Location"] == "/runners"
    home = client.get("/")
    assert home.status_code == 200 and b"Sign out" in home.content and b"dana" in home.content
    # Sign-out is a POST with the CSRF token; without it, refused.
    assert client.post("/signout").status_code == 403
    token = client.cookies["csrftoken"].value
    out = client.post("/signout", {"csrfmiddlewaretoken": token})
    assert out.status_code == 302 and out["Location"] == "/signin"
    assert client.get("/").status_code == 302


def test_local_single_user_mode_needs_no_sign_in(settings: object) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True  # type: ignore[attr-defined]
    response = Client().get("/")
    assert response.status_code == 200 and b"local" in response.content


def test_the_scripts_and_style_sheet_are_found_by_the_static_finders() -> None:
    """``/static/`` is served from the apps' folders by the ASGI application (the
    browser tests load every module through it); here, that the finders see them and
    that none loads anything from another origin (no CDN, no external fonts)."""
    names = sorted(path.name for path in STATIC.iterdir())
    assert {"session.js", "sessions.js", "app.css", "sse.js"} <= set(names)
    for name in names:
        found = finders.find(f"web/{name}")
        assert found, name
        body = Path(str(found)).read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)=["']?https?://""", body), name
        assert "@import" not in body and "url(http" not in body, name


@pytest.mark.parametrize("path", ["/v1/docs", "/v1/redoc"])
def test_the_api_docs_name_no_outside_host(path: str) -> None:
    """Swagger UI and Redoc from the sidecar's static files: no CDN, and no web fonts
    (drf-spectacular's own Redoc template links Google Fonts; the project's does not)."""
    response = Client(headers={"X-Forwarded-Email": ALICE}).get(path)
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/" in html
    hosts = set(re.findall(r"(?:https?:)?//([a-z0-9.-]+\.[a-z]{2,})", html, re.IGNORECASE))
    assert hosts == set(), hosts


def test_redoc_may_load_only_from_the_server() -> None:
    """Redoc's bundle draws Redocly's logo from a CDN; the page's policy stops it (the
    browser test sees the request refused before it leaves)."""
    policy = Client().get("/v1/redoc")["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy
    assert "http" not in policy
