"""Text that is not UTF-8 through the real ASGI application (http-api.md, Input
strictness): the URL's path and query string, the identity header, ``Last-Event-ID``
and a body, each given raw bytes as daphne hands them over. Every one is a 400
``invalid_input`` in the error format that names the byte and never echoes it, and
nothing is stored.

Daphne decodes a URL's path with ``errors="replace"``: ``%C0%AF.txt`` reached the
workspace view as ``\\ufffd.txt`` and the identity header's bytes became Latin-1 text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from omnigent_site.asgi import application
from sessions.models import Item, Session

from .asgi_http import asgi_request

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

USER = [(b"x-forwarded-email", b"alice@example.com")]
JSON_BODY = [*USER, (b"content-type", b"application/json")]
# Raw bytes, percent-encoded for a URL: overlong, encoded surrogate, truncated, lone
# continuation byte.
ENCODED = ["%C0%AF", "%ED%A0%80", "%E2%82", "%80"]
RAW = [b"\xc0\xaf", b"\xed\xa0\x80", b"ok\xe2\x82", b"\x80"]


def refusal(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> str:
    """The message of a 400 ``invalid_input`` in the error format."""
    assert status == 400, (status, body[:300])
    content_type = {name.lower(): value for name, value in headers}[b"content-type"]
    assert content_type.startswith(b"application/json"), content_type
    error = json.loads(body.decode("utf-8"))["error"]
    assert error["code"] == "invalid_input", error
    assert "\ufffd" not in error["message"]
    return str(error["message"])


@pytest.mark.parametrize("encoded", ENCODED)
async def test_a_url_path_that_is_not_utf8_is_400(session: Session, encoded: str) -> None:
    base = f"/v1/sessions/{session.id}"
    files = f"{base}/resources/environments/default/filesystem"
    for method, path, body in (
        ("GET", f"{base}{encoded}", b""),
        ("GET", f"{files}/{encoded}.txt", b""),
        ("PUT", f"{files}/{encoded}.txt", b'{"content": "x"}'),
        ("DELETE", f"{files}/dir/{encoded}", b""),
    ):
        status, headers, answer = await asgi_request(
            application, path, method=method, headers=JSON_BODY, body=body
        )
        assert "the URL's path is not valid UTF-8" in refusal(status, headers, answer), path
    # An escaped percent sign is a percent sign, and valid UTF-8 is a name.
    for name in ("%25C0%25AF.txt", "caf%C3%A9.txt"):
        status, _headers, answer = await asgi_request(application, f"{files}/{name}", headers=USER)
        assert status == 409, answer  # it reached the view: no runner is bound


@pytest.mark.parametrize("encoded", ENCODED)
async def test_a_query_string_that_is_not_utf8_is_400(session: Session, encoded: str) -> None:
    for path in (
        f"/v1/sessions?agent_name={encoded}",
        f"/v1/sessions/{session.id}/stream?after={encoded}",
        f"/v1/sessions/{session.id}/resources/environments/default/search?q={encoded}",
    ):
        status, headers, body = await asgi_request(application, path, headers=USER)
        assert "the query string is not valid UTF-8" in refusal(status, headers, body), path


@pytest.mark.parametrize("raw", RAW)
async def test_an_identity_header_that_is_not_utf8_is_400_and_creates_no_user(
    raw: bytes,
) -> None:
    """It was read as Latin-1 text, so ``\\xc0\\xaf`` created a user named ``À¯``."""
    users = await database_sync_to_async(get_user_model().objects.count)()
    status, headers, body = await asgi_request(
        application, "/v1/me", headers=[(b"x-forwarded-email", b"al" + raw + b"@example.com")]
    )
    assert "X-Forwarded-Email is not valid UTF-8" in refusal(status, headers, body)
    assert await database_sync_to_async(get_user_model().objects.count)() == users


async def test_an_identity_header_in_utf8_is_that_text() -> None:
    status, _headers, body = await asgi_request(
        application, "/v1/me", headers=[(b"x-forwarded-email", "jé@example.com".encode())]
    )
    assert status == 200, body
    assert json.loads(body)["user_id"] == "jé@example.com"


@pytest.mark.parametrize("raw", RAW)
async def test_a_last_event_id_that_is_not_utf8_is_400(session: Session, raw: bytes) -> None:
    for path in (f"/v1/sessions/{session.id}/stream", "/v1/sessions/updates"):
        status, headers, body = await asgi_request(
            application, path, headers=[*USER, (b"last-event-id", b"1" + raw)]
        )
        assert "Last-Event-ID" in refusal(status, headers, body)


@pytest.mark.parametrize("raw", RAW)
async def test_a_body_that_is_not_utf8_is_400_through_the_async_views(
    session: Session, raw: bytes
) -> None:
    base = f"/v1/sessions/{session.id}"
    for method, path, body in (
        ("PATCH", base, b'{"title": "' + raw + b'"}'),
        (
            "POST",
            f"{base}/events",
            b'{"type": "message", "data": {"role": "user", "content": "' + raw + b'"}}',
        ),
        ("PUT", f"{base}/policies", b'{"rules": [{"name": "' + raw + b'"}]}'),
        (
            "PUT",
            f"{base}/resources/environments/default/filesystem/a.txt",
            b'{"content": "' + raw + b'"}',
        ),
    ):
        status, headers, answer = await asgi_request(
            application, path, method=method, headers=JSON_BODY, body=body
        )
        assert "not UTF-8" in refusal(status, headers, answer), path
    stored: Any = await database_sync_to_async(Session.objects.get)(pk=session.id)
    assert stored.title is None
    assert await database_sync_to_async(Item.objects.count)() == 0
