"""``GET /metrics`` (operations.md): the Prometheus text format of ``metrics.py``'s
figures, off unless ``OMNIGENT_METRICS`` is on (404 in the error format), and with
``OMNIGENT_METRICS_TOKEN`` set only for ``Authorization: Bearer <token>`` (401)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .errors import json_error
from .metrics import Scrape, multiprocess_dir


def _authorised(request: HttpRequest) -> bool:
    token = settings.OMNIGENT_METRICS_TOKEN
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics`` in the Prometheus text format (sync: the scrape reads files and
    one row count)."""
    if not settings.OMNIGENT_METRICS:
        return json_error(404, f"no route for {request.path}")
    if request.method not in ("GET", "HEAD"):
        response = json_error(405, f"method {request.method} is not allowed")
        response["Allow"] = "GET, HEAD"
        return response
    if not _authorised(request):
        response = json_error(401, "a valid metrics token is required (Authorization: Bearer)")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body = generate_latest(Scrape(multiprocess_dir()))  # type: ignore[arg-type]
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
