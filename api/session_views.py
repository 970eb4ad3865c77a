"""Session endpoints that act on the session's runner (http-api.md).

``GET|PATCH|DELETE /v1/sessions/{id}``: binding a runner (``PATCH runner_id``) opens the
session on it, and a delete closes it there. ``POST /v1/sessions/{id}/events`` is an
async view, because it waits for the runner's acknowledgement. The work is in
``runners`` (``services``, ``dispatch``, ``verdicts``) and ``sessions``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase, HttpResponseNotModified
from django.utils.http import parse_etags
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.async_views import AsyncAPIView, RenderJSONOnLoopMixin
from omnigent_site.authentication import request_user
from omnigent_site.renderers import JSONRenderer
from omnigent_site.schema import error_responses
from runners import budget_updates, dispatch, services, verdicts
from runners.shapes import EventAcceptedOut
from sessions import budgets, selectors, snapshot_cache
from sessions import services as session_services
from sessions.models import Session
from sessions.permissions import EDIT, MANAGE, OWNER, READ, SessionAccess, SessionScopedMixin
from sessions.serializers import (
    ApprovalEventSerializer,
    EventSerializer,
    FunctionCallOutputSerializer,
    SessionUpdateSerializer,
)
from sessions.shapes import SessionDeletedOut, SessionOut, session_body, session_deleted_body
from usage.shapes import session_usage_from_totals


class SessionDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ, "PATCH": EDIT, "DELETE": OWNER}
    # Clients follow a turn by polling the snapshot: its own per-user rate (throttling.py).
    poll_methods = ("GET",)

    def required_session_level(self, request: Request) -> int:
        if request.method == "PATCH" and isinstance(request.data, dict):
            if "runner_id" in request.data:
                return OWNER
            if "share_workspace_files" in request.data:
                return MANAGE  # files.md §2: sharing the workspace is the managers' call
            if "budget_usd" in request.data:
                return MANAGE  # usage.md, Budgets
        return super().required_session_level(request)

    def browsable_links(self) -> list[tuple[str, str]]:
        """The session's other endpoints, linked from its browsable API page."""
        session_id = self.kwargs["session_id"]
        base = f"/v1/sessions/{quote(session_id)}"
        changes = f"{base}/resources/environments/default/changes"
        return [
            (f"{base}/items", "items"),
            (f"{base}/responses", "responses (turns)"),
            (f"{base}/stream?after=0", "stream (from the start)"),
            (changes, "workspace changes"),
            (f"{base}/permissions", "permissions"),
            (f"{base}/policies", "policy rules"),
            (f"{base}/elicitations?status=pending", "open approval questions"),
            (f"{base}/agent", "agent"),
        ]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "include_items",
                {"type": "boolean", "default": True},
                description="`false`, `0` or `no` return `items: []`",
            ),
            OpenApiParameter(
                "If-None-Match",
                str,
                location=OpenApiParameter.HEADER,
                description="ETags of snapshots the client holds (`*`, lists and `W/` "
                "forms accepted): a match answers 304 without a body",
            ),
            OpenApiParameter(
                "ETag",
                str,
                location=OpenApiParameter.HEADER,
                response=[200, 304],
                description="validator of this snapshot for this caller and query",
            ),
            OpenApiParameter(
                "Cache-Control",
                str,
                location=OpenApiParameter.HEADER,
                response=[200, 304],
                description="`private, no-cache`: revalidate every time",
            ),
        ],
        responses={
            200: SessionOut,
            304: OpenApiResponse(description="`If-None-Match` matched the ETag: unchanged."),
            **error_responses(401, 404),
        },
    )
    def get(self, request: Request, session_id: str) -> HttpResponseBase:
        """The snapshot; JSON answers carry an ETag, and a poller that saw nothing new
        gets 304 (or a kept body) without the items and open questions being read."""
        include = request.query_params.get("include_items", "true").lower() not in (
            "false",
            "0",
            "no",
        )
        renderer = getattr(request, "accepted_renderer", None)
        if not isinstance(renderer, JSONRenderer):
            # The browsable API's page holds forms and a CSRF token: no validator.
            return Response(self.snapshot(self.session, include_items=include))
        media_type = request.accepted_media_type
        etag = self.snapshot_etag(self.session, include_items=include)
        response: HttpResponse
        if etag_listed(header=request.headers.get("If-None-Match", ""), etag=etag):
            response = HttpResponseNotModified()
        else:
            body = snapshot_cache.cached_body(session_id=self.session.id, etag=etag)
            if body is None:
                data = self.snapshot(self.session, include_items=include)
                body = renderer.render(data, media_type, self.get_renderer_context())
                snapshot_cache.keep_body(session_id=self.session.id, etag=etag, body=body)
            response = HttpResponse(body, content_type=renderer.media_type)
        return with_validator(response, etag)

    def snapshot(self, session: Session, *, include_items: bool) -> SessionOut:
        items = selectors.snapshot_items(session_id=session.id) if include_items else []
        pending = selectors.pending_approvals(session_id=session.id)
        usage = session_usage_from_totals(session.usage_totals)
        return session_body(
            session, level=self.session_level, items=items, pending=pending, usage=usage
        )

    def snapshot_etag(self, session: Session, *, include_items: bool) -> str:
        """The validator of ``snapshot(session)`` as this request's JSON renders it."""
        return selectors.snapshot_etag(
            session=session,
            level=self.session_level,
            include_items=include_items,
            representation=self.request.accepted_media_type,
        )

    @extend_schema(
        request=SessionUpdateSerializer,
        parameters=[
            OpenApiParameter(
                "ETag",
                str,
                location=OpenApiParameter.HEADER,
                response=[200],
                description="validator of the snapshot this answer holds, as `GET` gives it",
            ),
        ],
        responses={200: SessionOut, **error_responses(400, 401, 403, 404, 413, 415)},
    )
    def patch(self, request: Request, session_id: str) -> Response:
        """The change, answered with the snapshot after it (and, in JSON, its ETag, so the
        caller's next poll of an unchanged session gets 304)."""
        serializer = SessionUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        session = self.session
        if "runner_id" in values:
            session = services.bind_session_runner(
                session=session,
                actor=request_user(request),
                runner_id=values.pop("runner_id") or "",
            )
        if "budget_usd" in values:
            session = budgets.set_session_budget(
                session=session, actor=request_user(request), budget_nano=values.pop("budget_usd")
            )
            budget_updates.push_session_budgets(sessions=[session])
        if values:
            session = session_services.update_session(session=session, **values)
        session.refresh_from_db()
        response = Response(self.snapshot(session, include_items=True))
        if isinstance(getattr(request, "accepted_renderer", None), JSONRenderer):
            # The same bytes a GET renders for this state, so the same validator.
            with_validator(response, self.snapshot_etag(session, include_items=True))
        return response

    @extend_schema(responses={200: SessionDeletedOut, **error_responses(401, 403, 404)})
    def delete(self, request: Request, session_id: str) -> Response:
        services.close_session_on_runner(session=self.session)
        session_services.delete_session(session=self.session, actor=request_user(request))
        return Response(session_deleted_body(session_id))


def with_validator(response: HttpResponseBase, etag: str) -> HttpResponseBase:
    """``response`` with the snapshot's ``ETag``, revalidated on every use."""
    response["ETag"] = etag
    response["Cache-Control"] = "private, no-cache"
    return response


def etag_listed(*, header: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` value names ``etag``: ``*``, or one of its tags,
    compared weakly (RFC 9110 §13.1.2: a ``W/`` prefix does not matter).

    Only this precondition is evaluated. Django's ``get_conditional_response`` would
    also answer ``If-Match`` with a bare 412 the API does not document, and with no
    ``Last-Modified`` sent, ``If-Modified-Since`` never applies.
    """
    tags = parse_etags(header)
    if tags == ["*"]:
        return True
    return any(tag.removeprefix("W/") == etag for tag in tags)


class SessionEventsView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False
    session_with_budgets = ("POST",)
    session_levels = {"POST": EDIT}
    # Every event goes to the session's runner: counted against its rate too.
    runner_throttled_methods = ("POST",)

    # Set by ``initial`` for a POST: the validated event.
    event: dict[str, Any]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """DRF's checks, then the event's validation (400), in the same trip to the
        request's thread: the order is authentication, permissions, throttles, then
        validation."""
        super().initial(request, *args, **kwargs)
        if request.method != "POST":
            return
        serializer = EventSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        self.event = serializer.validated_data

    def accept_message(self, request: Request) -> dispatch.AcceptedMessage:
        """On the request's thread: the message checked (400), its runner (503), then
        the message and its turn stored."""
        data = session_services.normalise_message(self.event["data"], field="data")
        if data["role"] != "user":
            raise ValidationError({"data": ["a message event must have role 'user'"]})
        return dispatch.accept_message(
            session=self.session,
            created_by=request.user.get_username(),
            data=data,
            tools=self.event.get("tools") or [],
            user_id=request.user.pk,
        )

    @extend_schema(
        request=EventSerializer,
        responses={
            202: OpenApiResponse(EventAcceptedOut, description="Accepted."),
            **error_responses(400, 401, 403, 404, 409, 413, 415, 429, 503),
        },
    )
    async def post(self, request: Request, session_id: str) -> HttpResponseBase:
        event = self.event
        kind = event["type"]
        if kind == "message":
            await dispatch.wait_for_reconnecting_runner(session=self.session)
            accepted = await sync_to_async(self.accept_message)(request)
            body = await dispatch.deliver_message(session=self.session, accepted=accepted)
        elif kind == "function_call_output":
            output = FunctionCallOutputSerializer(data=event["data"])
            output.is_valid(raise_exception=True)
            body = await dispatch.forward_tool_result(
                session=self.session,
                call_id=output.validated_data["call_id"],
                output=output.validated_data["output"],
            )
        elif kind == "interrupt":
            body = await dispatch.interrupt_turn(session=self.session, user=request_user(request))
        elif kind == "approval":
            answer = ApprovalEventSerializer(data=event["data"])
            answer.is_valid(raise_exception=True)
            await verdicts.answer_elicitation(
                session=self.session,
                approval_id=answer.validated_data["elicitation_id"],
                action=answer.validated_data["action"],
                reason=answer.validated_data.get("reason"),
                user=request_user(request),
                content=answer.validated_data.get("content"),
            )
            body = {"queued": False}
        else:
            raise ValidationError(
                {
                    "type": [
                        f"unknown event type {kind!r}: use message, function_call_output, "
                        "interrupt or approval"
                    ]
                }
            )
        return self.render_now(body, status=status.HTTP_202_ACCEPTED)
