"""Unknown routes under ``/v1/`` answer the JSON 404 for every method (issue 15, item 8).

Django's test client skips CSRF checks unless asked; these requests enforce them, as a
browser-less client talking to daphne gets them, so the catch-all must be CSRF-exempt
like the API views (whose callers authenticate by header or token, not by cookie).
"""

from __future__ import annotations

import pytest
from django.test import Client

from .conftest import ALICE, assert_error

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete", "options", "head")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("origin", [None, "omnigent://internal", "https://evil.example"])
@pytest.mark.parametrize("path", ["/v1/nope", "/v1/sessions/conv_x/nope/deeper"])
def test_unknown_route_is_the_json_404_for_every_method(
    method: str, origin: str | None, path: str
) -> None:
    client = Client(enforce_csrf_checks=True)
    headers = {"HTTP_X_FORWARDED_EMAIL": ALICE}
    if origin is not None:
        headers["HTTP_ORIGIN"] = origin
    body = {} if method in ("get", "head") else {"data": b'{"a": 1}'}
    response = getattr(client, method)(path, content_type="application/json", **body, **headers)
    if method == "head":
        assert response.status_code == 404
        return
    assert_error(response, 404, "not_found", mentions=path)


@pytest.mark.parametrize("method", ("post", "put", "patch", "delete"))
def test_unknown_route_with_a_session_cookie_is_still_the_json_404(method: str) -> None:
    """A logged-in browser (a CSRF cookie but no token) gets the 404 too, not the HTML page."""
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = "x" * 32
    response = getattr(client, method)("/v1/nope", data=b"{}", content_type="application/json")
    assert_error(response, 404, "not_found")
