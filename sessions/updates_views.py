"""``GET /v1/sessions/updates``: Server-Sent Events that keep a session list live."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from omnigent_site.async_views import AsyncAPIView
from omnigent_site.authentication import request_user
from omnigent_site.schema import error_responses

from .stream import parse_resume_point
from .stream_views import (
    EventStreamViewMixin,
    event_stream_response,
    sse_event_schema,
    stream_parameters,
)
from .updates_stream import UpdatesStream

UPDATES_STREAM = sse_event_schema(
    "Frames `id: <ms>\\nevent: <type>\\ndata: <json>\\n\\n`. First a `session.heartbeat`; "
    "with `Last-Event-ID` (or `?after=`) a `session.resync` (reload `GET /v1/sessions`), "
    "then live events: `session.added` and `session.updated` `{type, session}` "
    "(`SessionRowEvent`, the list row), `session.removed` `{type, session_id}` "
    "(`SessionRemovedEvent`), for every session the caller holds a grant on; a heartbeat "
    "every 15 s while idle; `data: [DONE]` when the server shuts down."
)


class SessionUpdatesView(EventStreamViewMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="sessions_updates",
        parameters=stream_parameters(
            after="resume point: answers `session.resync`", last_event_id="resume point"
        ),
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                UPDATES_STREAM, description="Live changes of the caller's session list."
            ),
            **error_responses(400, 401, 404, 429),
        },
    )
    async def get(self, request: Request) -> StreamingHttpResponse:
        resumed = (
            parse_resume_point(
                request.headers.get("Last-Event-ID"), request.query_params.get("after")
            )
            is not None
        )
        stream = UpdatesStream(user_pk=request_user(request).pk, resumed=resumed)
        return event_stream_response(stream, request)
