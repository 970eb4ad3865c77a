"""``GET /v1/sessions/updates``: Server-Sent Events that keep a session list live."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from omnigent_site.async_views import AsyncAPIView
from omnigent_site.authentication import request_user
from omnigent_site.schema import EventStream, error_responses
from sessions import updates_events
from sessions.stream import parse_resume_point
from sessions.updates_stream import UpdatesStream

from .stream_views import (
    EventStreamViewMixin,
    event_stream_response,
    sse_event_schema,
    stream_parameters,
)

UPDATES_STREAM = EventStream(
    "SessionListStreamFrame",
    frame=sse_event_schema(
        "Frames `id: <n>\\nevent: <type>\\ndata: <json>\\n\\n`, `n` the event's number in "
        "the caller's list log. First a `session.heartbeat` (no `id`); then, with "
        "`Last-Event-ID` (or `?after=`), what changed since: each session's current row "
        "(or its removal), or a `session.resync` (reload `GET /v1/sessions`) when the log "
        "no longer reaches back that far; then live events: `session.added`, "
        "`session.updated`, `session.removed`, for every session the caller holds a "
        "grant on; a heartbeat every 15 s while idle; `data: [DONE]` when the server "
        "shuts down."
    ),
    events=updates_events.EVENTS,
)


class SessionUpdatesView(EventStreamViewMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="sessions_updates",
        parameters=stream_parameters(
            after="resume point: the number of the last list event seen",
            last_event_id="resume point",
        ),
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                UPDATES_STREAM, description="Live changes of the caller's session list."
            ),
            **error_responses(400, 401, 404, 429),
        },
    )
    async def get(self, request: Request) -> StreamingHttpResponse:
        after = parse_resume_point(
            request.headers.get("Last-Event-ID"), request.query_params.get("after")
        )
        stream = UpdatesStream(user_pk=request_user(request).pk, after=after)
        return event_stream_response(stream, request)
