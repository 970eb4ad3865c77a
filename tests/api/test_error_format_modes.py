"""The error format for every status in both DEBUG modes (http-api.md, Input strictness).

With ``DEBUG`` on, Django answers an exception that escapes DRF (a plain Django view, a
response that fails to render) with its HTML traceback page; on API paths the answer
must still be ``{"error": {"code", "message"}}`` (``omnigent_site.errors``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from omnigent_site import health
from omnigent_site.errors import exception_handler
from sessions import selectors

from .conftest import ALICE, assert_error

pytestmark = [pytest.mark.django_db, pytest.mark.parametrize("debug", [False, True])]


@pytest.fixture
def client(client_for: Callable[[str | None], APIClient], settings: Any, debug: bool) -> APIClient:
    settings.DEBUG = debug
    client = client_for(ALICE)
    client.raise_request_exception = False  # answer as a server would, not re-raise
    return client


def boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("forced failure \ud800")


def test_a_500_in_a_drf_view(client: APIClient, monkeypatch: Any) -> None:
    monkeypatch.setattr(selectors, "sessions_granted_to", boom)
    error = assert_error(client.get("/v1/sessions"), 500, "internal_error")
    assert "forced" not in error["message"]


def test_a_500_in_a_plain_django_view(client: APIClient, monkeypatch: Any) -> None:
    async def failing_check() -> bool:
        raise RuntimeError("forced failure")

    monkeypatch.setattr(health, "_channel_layer_ok", failing_check)
    error = assert_error(client.get("/health"), 500, "internal_error")
    assert "forced" not in error["message"]


def test_a_500_while_rendering_a_response(client: APIClient, monkeypatch: Any) -> None:
    monkeypatch.setattr(JSONRenderer, "render", boom)
    assert_error(client.get("/v1/me"), 500, "internal_error")


def test_4xx(client: APIClient, create_session: Callable[..., str]) -> None:
    session_id = create_session(ALICE)
    path = f"/v1/sessions/{session_id}"
    assert_error(
        client.patch(path, '{"title": ', content_type="application/json"), 400, "invalid_input"
    )
    assert_error(client.get("/v1/sessions/conv_unknown"), 404, "not_found")
    assert_error(client.get("/v1/no/such/route"), 404, "not_found")
    assert_error(client.post(path, {}, format="json"), 405, "method_not_allowed")
    assert_error(client.patch(path, "t", content_type="text/plain"), 415, "unsupported_media_type")


def test_an_error_naming_unencodable_text_still_renders(debug: bool) -> None:
    """An error that echoes the bad input (a field name, a value) escapes what UTF-8
    cannot encode instead of failing to render (a 500)."""
    response = exception_handler(ValidationError({"\ud800": ["bad value \udfff"]}), {"view": None})
    assert response.status_code == 400
    body = json.loads(JSONRenderer().render(response.data).decode("utf-8"))
    assert body["error"]["fields"] == {"\\ud800": ["bad value \\udfff"]}
    assert body["error"]["message"] == "\\ud800: bad value \\udfff"
