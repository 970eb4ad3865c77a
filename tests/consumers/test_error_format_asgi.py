"""The error format through the real ASGI application, DEBUG on and off (issue 15, item 3).

``tests/api/test_error_format_modes.py`` checks the same through Django's test client
(a synchronous middleware chain); here the chain is the async one daphne runs, and the
bodies are the bytes a client receives: a forced 500 (a plain view, a response that
fails to render, with a lone surrogate in the exception's text), a deep body, a lone
surrogate and a malformed resume point.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer

from omnigent_site import health
from omnigent_site.asgi import application

from .asgi_http import asgi_request

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("debug", [False, True]),
]

USER = [(b"x-forwarded-email", b"alice@example.com")]
JSON_BODY = [*USER, (b"content-type", b"application/json")]


def boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("forced failure \ud800")


def error_of(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    content_type = {name.lower(): value for name, value in headers}[b"content-type"]
    assert content_type.startswith(b"application/json"), (status, body[:300])
    error = json.loads(body.decode("utf-8"))["error"]
    assert set(error) <= {"code", "message", "fields"}
    return dict(error)


async def test_forced_500s_are_the_format(settings: Any, debug: bool, monkeypatch: Any) -> None:
    settings.DEBUG = debug

    async def failing_check() -> bool:
        raise RuntimeError("forced failure \ud800")

    monkeypatch.setattr(health, "_channel_layer_ok", failing_check)
    status, headers, body = await asgi_request(application, "/health")
    assert (status, error_of(status, headers, body)["code"]) == (500, "internal_error")

    monkeypatch.setattr(JSONRenderer, "render", boom)
    status, headers, body = await asgi_request(application, "/v1/me", headers=USER)
    assert (status, error_of(status, headers, body)["code"]) == (500, "internal_error")


async def test_hostile_input_is_a_renderable_400(settings: Any, debug: bool) -> None:
    settings.DEBUG = debug
    for raw in (b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"name": "\\ud800"}'):
        status, headers, body = await asgi_request(
            application, "/v1/runners", method="POST", headers=JSON_BODY, body=raw
        )
        assert (status, error_of(status, headers, body)["code"]) == (400, "invalid_input")
    status, headers, body = await asgi_request(
        application, "/v1/sessions/updates?after=%C2%B2", headers=USER
    )
    assert (status, error_of(status, headers, body)["code"]) == (400, "invalid_input")
