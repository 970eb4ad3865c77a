"""The base and helpers of the async DRF views (``adrf``).

Async views derive from :data:`AsyncAPIView`, adrf's ``APIView`` unchanged.

Django renders a DRF ``Response`` (a ``SimpleTemplateResponse``) after the view
returns, and for an async view it does so through ``sync_to_async``: a trip to
the request's thread for every response, on the way out of the relay's hot
path. JSON, which is what API clients accept, is rendered on the event loop
instead; any other renderer (the browsable API's HTML page, which may read the
database) keeps DRF's ``Response`` and its thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adrf.views import APIView as AdrfAPIView
from django.http import HttpResponse, HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response

from .renderers import JSONRenderer

AsyncAPIView = AdrfAPIView


class RenderJSONOnLoopMixin:
    """For async views: ``self.render_now(data, status=...)`` instead of ``Response``."""

    # Provided by DRF's APIView.
    request: Request
    get_renderer_context: Callable[[], dict[str, Any]]

    def render_now(self, data: Any, *, status: int) -> HttpResponseBase:
        renderer = getattr(self.request, "accepted_renderer", None)
        if not isinstance(renderer, JSONRenderer):
            return Response(data, status=status)
        content = renderer.render(
            data, self.request.accepted_media_type, self.get_renderer_context()
        )
        return HttpResponse(content, status=status, content_type=renderer.media_type)
