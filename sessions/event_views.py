"""``POST /v1/sessions/{id}/events``: an async view, because it waits for a runner."""

from __future__ import annotations

from adrf.views import APIView as AsyncAPIView
from django.http import HttpResponseBase
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from omnigent_site.async_views import RenderJSONOnLoopMixin

from . import turns
from .permissions import EDIT, SessionAccess, SessionScopedMixin
from .serializers import EventSerializer, FunctionCallOutputSerializer
from .services import normalise_message


class SessionEventsView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False
    session_levels = {"POST": EDIT}

    @extend_schema(request=EventSerializer, responses={202: dict})
    async def post(self, request: Request, session_id: str) -> HttpResponseBase:
        serializer = EventSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        event = serializer.validated_data
        kind = event["type"]
        if kind == "message":
            data = normalise_message(event["data"], field="data")
            if data["role"] != "user":
                raise ValidationError({"data": ["a message event must have role 'user'"]})
            body = await turns.submit_message(
                session=self.session,
                created_by=request.user.get_username(),
                data=data,
                tools=event.get("tools") or [],
            )
        elif kind == "function_call_output":
            output = FunctionCallOutputSerializer(data=event["data"])
            output.is_valid(raise_exception=True)
            body = await turns.forward_tool_result(
                session=self.session,
                call_id=output.validated_data["call_id"],
                output=output.validated_data["output"],
            )
        elif kind == "interrupt":
            body = await turns.interrupt_turn(session=self.session)
        else:
            raise ValidationError(
                {
                    "type": [
                        f"unknown event type {kind!r}: use message, function_call_output or interrupt"
                    ]
                }
            )
        return self.render_now(body, status=status.HTTP_202_ACCEPTED)
