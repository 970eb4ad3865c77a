"""JSON bodies as the API sends them: DRF's compact JSON, then one newline.

A body that ends its line prints cleanly from ``curl`` (the next prompt starts on a line
of its own) and streams as JSON Lines; to a JSON parser the newline is whitespace, so
the wire shape clients read is unchanged. Every JSON answer goes through here: DRF
views (the renderer in ``REST_FRAMEWORK``), async views that render on the event loop,
Django-level errors and ``/health`` (``JSONResponse``), and the socket-level 413.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse
from rest_framework import renderers


class FinalNewlineMixin:
    """A renderer whose non-empty body ends with a newline."""

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        body: bytes = super().render(data, accepted_media_type, renderer_context)  # type: ignore[misc]
        return body + b"\n" if body and not body.endswith(b"\n") else body


class JSONRenderer(FinalNewlineMixin, renderers.JSONRenderer):
    """DRF's JSON renderer (compact, UTF-8) with a final newline."""


def json_bytes(data: Any) -> bytes:
    """``data`` (plain JSON values) in the same bytes as ``JSONRenderer``: compact,
    UTF-8, a final newline. The standard library's encoder rather than DRF's, so the
    500 answered when a DRF response failed to render never depends on that renderer."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8") + b"\n"


class JSONResponse(HttpResponse):
    """A JSON answer outside DRF (Django's error handlers, ``/health``), rendered as the
    API renders its own; Django's ``JsonResponse`` would put spaces after separators and
    no newline."""

    def __init__(self, data: Any, *, status: int = 200) -> None:
        super().__init__(json_bytes(data), status=status, content_type="application/json")
