"""``/`` and ``GET /v1/``: where a person opening the server in a browser lands."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_root_is_the_web_page_and_asks_for_a_sign_in() -> None:
    response = APIClient().get("/")
    assert response.status_code == 302
    assert response["Location"] == "/signin?next=%2F"


def test_api_root_links_the_entry_points() -> None:
    response = APIClient().get("/v1/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "me": "http://testserver/v1/me",
        "sessions": "http://testserver/v1/sessions",
        "agents": "http://testserver/v1/agents",
        "runners": "http://testserver/v1/runners",
        "schema": "http://testserver/v1/schema",
        "docs": "http://testserver/v1/docs",
    }


def test_api_root_is_browsable() -> None:
    response = APIClient().get("/v1/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert b"http://testserver/v1/sessions" in response.content
