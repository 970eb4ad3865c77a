"""HTTPS redirect with ``DJANGO_DEBUG=0`` (issue 15, item 7): the API moves to HTTPS, the
health probe a load balancer sends over plain HTTP does not, and a request a trusted
proxy marks as HTTPS is served (docs/deployment.md, "HTTPS")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from .conftest import ALICE

pytestmark = pytest.mark.django_db


@pytest.fixture
def https_only(settings: Any) -> Any:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_REDIRECT_EXEMPT = [r"^health$"]
    return settings


def test_plain_http_api_request_is_redirected(
    https_only: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    response = client_for(ALICE).get("/v1/me")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/v1/me"


def test_health_stays_on_plain_http(
    https_only: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    response = client_for(None).get("/health")
    assert response.status_code == 200


def test_https_request_gets_hsts(
    https_only: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    response = client_for(ALICE).get("/v1/me", secure=True)
    assert response.status_code == 200
    assert response["Strict-Transport-Security"].startswith("max-age=31536000")


def test_proxy_marked_https_is_served_when_the_header_is_trusted(
    https_only: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    https_only.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    response = client_for(ALICE).get("/v1/me", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
