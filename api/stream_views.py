"""``GET /v1/sessions/{id}/stream``: Server-Sent Events of one session."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from omnigent_site.async_views import AsyncAPIView
from omnigent_site.renderers import JSONRenderer
from omnigent_site.runtime.flow import SCOPE_KEY
from omnigent_site.schema import EventStream, error_responses
from omnigent_site.stream_slots import SlotStreamingResponse, claim_stream_slot
from sessions import stream_events
from sessions.permissions import SessionAccess, SessionScopedMixin
from sessions.stream import RESUME_POINT_SCHEMA, SessionStream, parse_resume_point


def sse_event_schema(description: str) -> dict[str, Any]:
    """The schema of one Server-Sent Event, read as its fields (``event``, ``id``,
    ``data``): OpenAPI 3.0 has no schema for a whole stream, so under
    ``text/event-stream`` the schema describes each event (what schemathesis validates
    every frame it reads against); the event types are in ``description``."""
    return {
        "type": "object",
        "description": description,
        "required": ["data"],
        "additionalProperties": False,
        "properties": {
            "event": {"type": "string", "description": "the event type (`type` in `data`)"},
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the resume point"},
            "data": {
                "type": "string",
                "description": "the event as JSON (its shape by `type`: `x-events`), or `[DONE]`",
            },
            "retry": {"type": "integer"},
        },
    }


# The body is not JSON: a stream of ``id:``/``event:``/``data:`` frames. The frame format
# is described here, the events in ``stream_events.py``.
EVENT_STREAM = EventStream(
    "SessionStreamFrame",
    frame=sse_event_schema(
        "Frames `id: <seq>\\nevent: <type>\\ndata: <json>\\n\\n`; the JSON carries `type`. "
        "First a `session.heartbeat`, then stored events after the resume point, then live "
        "events; a heartbeat every 15 s while idle; `data: [DONE]` when the session is "
        "deleted or the server shuts down. Event types: "
        + ", ".join(f"`{kind}`" for kind in stream_events.EVENTS)
        + "."
    ),
    events=stream_events.EVENTS,
)


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` negotiate; errors are still rendered as JSON."""

    media_type = "text/event-stream"
    format = "sse"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return json.dumps(data).encode("utf-8")


def stream_parameters(*, after: str, last_event_id: str) -> list[OpenApiParameter]:
    """The resume points a stream takes and the headers its 200 carries (OpenAPI)."""
    return [
        OpenApiParameter("after", RESUME_POINT_SCHEMA, description=after),
        OpenApiParameter(
            "Last-Event-ID",
            RESUME_POINT_SCHEMA,
            location=OpenApiParameter.HEADER,
            description=last_event_id,
        ),
        OpenApiParameter(
            "Cache-Control",
            str,
            location=OpenApiParameter.HEADER,
            response=[200],
            description="`no-cache`",
        ),
        OpenApiParameter(
            "X-Accel-Buffering",
            str,
            location=OpenApiParameter.HEADER,
            response=[200],
            description="`no`: proxies must not buffer the stream",
        ),
    ]


def event_stream_response(stream: Any, request: Request) -> StreamingHttpResponse:
    """The streaming response of an SSE view, holding one of the user's stream slots
    (``omnigent_site/stream_slots.py``) until it ends.

    Called last in the view: nothing may raise between taking the slot and the
    response that gives it back.
    """
    slot = claim_stream_slot(request.user)
    response = SlotStreamingResponse(stream, slot=slot, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# An SSE view: events when it streams, error bodies as JSON whatever was asked for. (A
# comment, not a docstring: the schema would take a docstring as each view's description.)
class EventStreamViewMixin:
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def finalize_response(
        self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        if not isinstance(response, StreamingHttpResponse):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(  # type: ignore[misc, no-any-return]
            request, response, *args, **kwargs
        )


class SessionStreamView(EventStreamViewMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False

    @extend_schema(
        parameters=stream_parameters(
            after="resume after this event id (1 to 19 ASCII digits; else 400)",
            last_event_id="resume point (wins over `after`)",
        ),
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                EVENT_STREAM,
                description="Server-Sent Events of the session (http-api.md, Stream).",
            ),
            **error_responses(400, 401, 404, 429),
        },
    )
    async def get(self, request: Request, session_id: str) -> StreamingHttpResponse:
        after = parse_resume_point(
            request.headers.get("Last-Event-ID"), request.query_params.get("after")
        )
        scope = getattr(request._request, "scope", {}) or {}
        stream = SessionStream(session_id=session_id, after=after, watch=scope.get(SCOPE_KEY))
        return event_stream_response(stream, request)
