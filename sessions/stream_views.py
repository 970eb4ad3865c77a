"""``GET /v1/sessions/{id}/stream``: Server-Sent Events of one session."""

from __future__ import annotations

import json
from typing import Any

from adrf.views import APIView as AsyncAPIView
from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from omnigent_site.flow import SCOPE_KEY

from .permissions import SessionAccess, SessionScopedMixin
from .stream import SessionStream, parse_resume_point


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` negotiate; errors are still rendered as JSON."""

    media_type = "text/event-stream"
    format = "sse"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return json.dumps(data).encode("utf-8")


class SessionStreamView(SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="resume after this event id"),
            OpenApiParameter(
                "Last-Event-ID", int, location=OpenApiParameter.HEADER, description="resume point"
            ),
        ],
        responses={(200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR)},
    )
    async def get(self, request: Request, session_id: str) -> StreamingHttpResponse:
        after = parse_resume_point(
            request.headers.get("Last-Event-ID"), request.query_params.get("after")
        )
        scope = getattr(request._request, "scope", {}) or {}
        stream = SessionStream(session_id=session_id, after=after, watch=scope.get(SCOPE_KEY))
        response = StreamingHttpResponse(stream, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    def finalize_response(
        self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        # Error bodies are JSON whatever the client asked for.
        if not isinstance(response, StreamingHttpResponse):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)
