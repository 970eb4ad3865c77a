"""The admin login, CSRF and the browsable API through the ASGI application, as daphne
serves them: the project's middleware hooks run inline on the event loop there, and
these are the pages whose hooks do real work (sessions, CSRF cookies, messages)."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from omnigent_site.asgi import application

from .asgi_http import asgi_request

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-test-password"
FORM = (b"content-type", b"application/x-www-form-urlencoded")


class Browser:
    """Keeps cookies between requests, as a browser does."""

    def __init__(self) -> None:
        self.cookies: dict[str, str] = {}

    async def request(
        self,
        path: str,
        *,
        method: str = "GET",
        form: dict[str, str] | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> tuple[int, dict[str, str], str]:
        sent = list(headers or [])
        if self.cookies:
            jar = "; ".join(f"{key}={value}" for key, value in self.cookies.items())
            sent.append((b"cookie", jar.encode()))
        body = b""
        if form is not None:
            sent.append(FORM)
            body = urlencode(form).encode()
        status, raw_headers, content = await asgi_request(
            application, path, method=method, headers=sent, body=body
        )
        answer: dict[str, str] = {}
        for name, value in raw_headers:
            if name.lower() == b"set-cookie":
                cookie = SimpleCookie(value.decode())
                for key, morsel in cookie.items():
                    if morsel.value:
                        self.cookies[key] = morsel.value
                    else:
                        self.cookies.pop(key, None)
            answer[name.decode().lower()] = value.decode()
        return status, answer, content.decode(errors="replace")

    async def request_raw(
        self, path: str, *, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> tuple[int, dict[str, str], str]:
        """A POST with a body as given (a JSON client in the logged-in browser)."""
        jar = "; ".join(f"{key}={value}" for key, value in self.cookies.items())
        status, raw_headers, content = await asgi_request(
            application,
            path,
            method="POST",
            headers=[*headers, (b"cookie", jar.encode()), (b"referer", b"http://testserver/")],
            body=body,
        )
        answer = {name.decode().lower(): value.decode() for name, value in raw_headers}
        return status, answer, content.decode(errors="replace")

    async def csrf_form_token(self, path: str) -> str:
        status, _headers, page = await self.request(path)
        assert status == 200, page[:500]
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert found, "no CSRF token in the form"
        assert "csrftoken" in self.cookies
        return found.group(1)


@pytest.fixture
def admin_user() -> Any:
    return get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)


async def _login(browser: Browser) -> tuple[int, dict[str, str]]:
    token = await browser.csrf_form_token("/admin/login/")
    status, headers, _page = await browser.request(
        "/admin/login/?next=/admin/",
        method="POST",
        form={"csrfmiddlewaretoken": token, "username": "root", "password": PASSWORD},
        headers=[(b"referer", b"http://testserver/admin/login/")],
    )
    return status, headers


async def test_admin_login_session_and_logout(admin_user: Any) -> None:
    browser = Browser()
    status, headers = await _login(browser)
    assert status == 302 and headers["location"] == "/admin/"
    assert "sessionid" in browser.cookies
    status, _headers, page = await browser.request("/admin/")
    assert status == 200 and "Site administration" in page

    token = await browser.csrf_form_token("/admin/password_change/")
    status, _headers, page = await browser.request(
        "/admin/logout/",
        method="POST",
        form={"csrfmiddlewaretoken": token},
        headers=[(b"referer", b"http://testserver/admin/")],
    )
    assert status == 200 and "Logged out" in page
    status, headers, _page = await browser.request("/admin/")
    assert status == 302 and headers["location"].startswith("/admin/login/")


async def test_a_post_without_the_csrf_token_is_refused_and_logs_nobody_in(
    admin_user: Any,
) -> None:
    browser = Browser()
    await browser.csrf_form_token("/admin/login/")
    status, _headers, _page = await browser.request(
        "/admin/login/",
        method="POST",
        form={"username": "root", "password": PASSWORD},
        headers=[(b"referer", b"http://testserver/admin/login/")],
    )
    assert status == 403
    assert "sessionid" not in browser.cookies
    wrong = await browser.csrf_form_token("/admin/login/")
    status, _headers, page = await browser.request(
        "/admin/login/",
        method="POST",
        form={"csrfmiddlewaretoken": wrong, "username": "root", "password": "wrong"},
        headers=[(b"referer", b"http://testserver/admin/login/")],
    )
    assert status == 200 and "Please enter the correct username and password" in page
    assert "sessionid" not in browser.cookies


async def test_the_browsable_api_serves_a_logged_in_user(admin_user: Any) -> None:
    browser = Browser()
    status, _headers = await _login(browser)
    assert status == 302
    html = [(b"accept", b"text/html")]
    status, headers, page = await browser.request("/v1/sessions", headers=html)
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "Django REST framework" in page and "root" in page
    # The same page without the login cookie is refused in the error format's status.
    status, _headers, _page = await Browser().request("/v1/sessions", headers=html)
    assert status == 401
    assert await sync_to_async(get_user_model().objects.filter(username="root").exists)()


async def test_a_logged_in_browser_needs_the_csrf_token_to_write_through_the_api(
    admin_user: Any,
) -> None:
    browser = Browser()
    status, _headers = await _login(browser)
    assert status == 302
    body = b'{"name": "from-the-browser"}'
    json_type = (b"content-type", b"application/json")
    status, _headers, page = await browser.request_raw(
        "/v1/runners", body=body, headers=[json_type]
    )
    assert status == 403 and "CSRF" in page
    status, _headers, page = await browser.request_raw(
        "/v1/runners",
        body=body,
        headers=[json_type, (b"x-csrftoken", browser.cookies["csrftoken"].encode())],
    )
    assert status == 201, page
    assert '"name":"from-the-browser"' in page.replace(" ", "")
