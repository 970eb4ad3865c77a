"""Every JSON answer is the API's compact JSON followed by one newline, so a body
printed by ``curl`` ends its line (README, "A first session with curl"), whichever code
renders it: a DRF view, the snapshot's own renderer and cache, the exception handler,
Django's error handlers, ``/health``, the schema, the socket-level 413."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from omnigent_site.runtime.body_limit import refusal_bytes

from .conftest import ALICE

pytestmark = pytest.mark.django_db


def assert_one_json_line(content: bytes) -> Any:
    assert content.endswith(b"}\n") or content.endswith(b"]\n"), content[-40:]
    assert content.count(b"\n") == 1, content[:200]
    value = json.loads(content)
    # The compact wire shape: no space after separators.
    assert content == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    return value


def test_api_answers_end_with_a_newline(
    client_for: Callable[..., Any], create_session: Callable[..., str]
) -> None:
    alice = client_for(ALICE)
    session_id = create_session(ALICE, title="first try")
    created = alice.post("/v1/runners", {"name": "laptop"}, format="json")
    assert created.status_code == 201
    assert assert_one_json_line(created.content)["name"] == "laptop"
    for path in (
        "/v1/sessions",
        f"/v1/sessions/{session_id}",  # the snapshot renders (and keeps) its own bytes
        f"/v1/sessions/{session_id}",  # ... and the kept body is the same
        f"/v1/sessions/{session_id}/items",
        "/v1/runners",
        "/v1/",
    ):
        response = alice.get(path, HTTP_ACCEPT="application/json")
        assert response.status_code == 200, path
        assert_one_json_line(response.content)


def test_error_answers_end_with_a_newline(client_for: Callable[..., Any]) -> None:
    alice = client_for(ALICE)
    drf_error = alice.get("/v1/sessions/conv_missing")  # the exception handler
    assert drf_error.status_code == 404
    assert assert_one_json_line(drf_error.content)["error"]["code"] == "not_found"
    no_route = Client().get("/v1/no/such/route")  # Django's 404 handler
    assert no_route.status_code == 404
    assert assert_one_json_line(no_route.content)["error"]["code"] == "not_found"
    refused = refusal_bytes(1024)  # written on the socket before Django sees the request
    head, body = refused.split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(body)}".encode() in head
    assert assert_one_json_line(body)["error"]["code"] == "payload_too_large"


def test_health_and_the_json_schema_end_with_a_newline() -> None:
    health = Client().get("/health")
    assert health.status_code == 200
    assert assert_one_json_line(health.content)["status"] == "ok"
    schema = Client().get("/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert schema.content.endswith(b"}\n")
    assert json.loads(schema.content)["openapi"].startswith("3.")
