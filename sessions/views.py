"""Session, agent, item, response and permission endpoints (http-api.md). Thin: parse,
authorize, call a service or selector, render."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, UnsupportedMediaType, ValidationError
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import PayloadTooLarge
from omnigent_site.pagination import paginate, parse_list_params
from omnigent_site.users import is_admin

from . import selectors, services
from .models import Permission
from .permissions import MANAGE, OWNER, READ, SessionAccess, SessionScopedMixin
from .serializers import (
    AgentOutSerializer,
    DeletedSerializer,
    GrantOutSerializer,
    PermissionGrantSerializer,
    ResponseOutSerializer,
    SessionCreatedSerializer,
    SessionCreateSerializer,
    SessionOutSerializer,
    agent_body,
    grant_body,
    parse_metadata_part,
    response_body,
    session_body,
)

LIST_PARAMS = [
    OpenApiParameter("limit", int, description="1 to 1000"),
    OpenApiParameter("after", str, description="cursor: an id"),
    OpenApiParameter("before", str, description="cursor: an id"),
    OpenApiParameter("order", str, enum=["asc", "desc"]),
]


def read_bundle_part(request: Request) -> bytes:
    upload = request.FILES.get("bundle")
    if upload is None:
        if "bundle" in request.data:
            raise ValidationError({"bundle": ["the bundle part must be a file upload"]})
        raise ValidationError({"bundle": ["missing multipart part 'bundle'"]})
    if upload.size > settings.OMNIGENT_MAX_BUNDLE_BYTES:
        raise PayloadTooLarge(
            f"the bundle is {upload.size} bytes; the limit is {settings.OMNIGENT_MAX_BUNDLE_BYTES}"
        )
    return upload.read()


def require_content_type(request: Request, *allowed: str) -> str:
    media = (request.content_type or "").split(";")[0].strip().lower()
    if media not in allowed:
        raise UnsupportedMediaType(
            media or "none", detail=f"Content-Type must be one of: {', '.join(allowed)}"
        )
    return media


# --- agents -----------------------------------------------------------------------


class AgentListView(APIView):
    parser_classes = [MultiPartParser]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        parameters=[*LIST_PARAMS, OpenApiParameter("name", str)],
        responses=AgentOutSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        params = parse_list_params(request.query_params)
        queryset = selectors.template_agents()
        if name := request.query_params.get("name"):
            queryset = queryset.filter(name=name)
        page = paginate(queryset, params, sort_field="created_at")
        return Response(page.body(agent_body, lambda agent: agent.id))

    @extend_schema(
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {"bundle": {"type": "string", "format": "binary"}},
            }
        },
        responses={201: AgentOutSerializer},
    )
    def post(self, request: Request) -> Response:
        require_content_type(request, "multipart/form-data")
        agent = services.create_template_agent(
            data=read_bundle_part(request), user=request_user(request)
        )
        return Response(agent_body(agent), status=status.HTTP_201_CREATED)


class AgentDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=AgentOutSerializer)
    def get(self, request: Request, agent_id: str) -> Response:
        return Response(
            agent_body(selectors.agent_for(agent_id=agent_id, user=request_user(request)))
        )

    @extend_schema(responses=DeletedSerializer)
    def delete(self, request: Request, agent_id: str) -> Response:
        agent = selectors.agent_for(agent_id=agent_id, user=request_user(request))
        services.delete_template_agent(
            agent=agent, user=request_user(request), is_admin=is_admin(request.user)
        )
        return Response({"id": agent_id, "object": "agent.deleted", "deleted": True})


# --- sessions ---------------------------------------------------------------------


class SessionListView(APIView):
    parser_classes = [JSONParser, MultiPartParser]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        parameters=[
            *LIST_PARAMS,
            OpenApiParameter("agent_id", str),
            OpenApiParameter("agent_name", str),
            OpenApiParameter("sort_by", str, enum=["created_at", "updated_at"]),
        ],
        responses=SessionOutSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        params = parse_list_params(request.query_params)
        sort_by = request.query_params.get("sort_by") or "created_at"
        if sort_by not in ("created_at", "updated_at"):
            raise ValidationError({"sort_by": ["must be 'created_at' or 'updated_at'"]})
        queryset = selectors.sessions_granted_to(user=request_user(request))
        if agent_id := request.query_params.get("agent_id"):
            queryset = queryset.filter(agent_id=agent_id)
        if agent_name := request.query_params.get("agent_name"):
            queryset = queryset.filter(agent__name=agent_name)
        page = paginate(queryset, params, sort_field=sort_by)
        levels = selectors.grant_levels(
            user=request_user(request), session_ids=[session.id for session in page.objects]
        )
        return Response(
            page.body(
                lambda session: session_body(session, level=levels.get(session.id, 0)),
                lambda session: session.id,
            )
        )

    @extend_schema(
        request={
            "application/json": SessionCreateSerializer,
            "multipart/form-data": {
                "type": "object",
                "properties": {
                    "metadata": {"type": "string", "description": "JSON: title, labels"},
                    "bundle": {"type": "string", "format": "binary"},
                },
                "required": ["bundle"],
            },
        },
        responses={201: SessionCreatedSerializer},
    )
    def post(self, request: Request) -> Response:
        media = require_content_type(request, "application/json", "multipart/form-data")
        if media == "multipart/form-data":
            unknown = sorted(set(request.data) - {"metadata", "bundle"})
            if unknown:
                raise ValidationError({part: ["unknown multipart part"] for part in unknown})
            assert isinstance(request.data, dict)  # multipart: a QueryDict
            metadata = parse_metadata_part(request.data.get("metadata"))
            session = services.create_session_from_bundle(
                user=request_user(request), data=read_bundle_part(request), **metadata
            )
            return Response(
                {
                    "session_id": session.id,
                    "agent_id": session.agent_id,
                    "agent_name": session.agent.name,
                },
                status=status.HTTP_201_CREATED,
            )
        serializer = SessionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        agent = selectors.agent_for(agent_id=values.pop("agent_id"), user=request_user(request))
        session = services.create_session(user=request_user(request), agent=agent, **values)
        items = list(selectors.session_items(session=session))
        return Response(
            session_body(session, level=OWNER, items=items), status=status.HTTP_201_CREATED
        )


class SessionItemsView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(parameters=LIST_PARAMS, responses=dict)
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_limit=100, default_order="asc")
        page = paginate(
            selectors.session_items(session=self.session),
            params,
            sort_field="seq",
            cursor_field="id",
        )
        return Response(page.body(lambda item: item.flat(), lambda item: item.id))


class SessionAgentView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses=AgentOutSerializer)
    def get(self, request: Request, session_id: str) -> Response:
        return Response(agent_body(self.session.agent))


class ResponseListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(parameters=LIST_PARAMS, responses=ResponseOutSerializer(many=True))
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_order="asc")
        page = paginate(
            selectors.session_responses(session=self.session), params, sort_field="created_at"
        )
        return Response(
            page.body(
                lambda turn: response_body(turn, output=selectors.response_output(response=turn)),
                lambda turn: turn.id,
            )
        )


class ResponseDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses=ResponseOutSerializer)
    def get(self, request: Request, session_id: str, response_id: str) -> Response:
        turn = selectors.session_responses(session=self.session).filter(pk=response_id).first()
        if turn is None:
            raise NotFound(f"response {response_id!r} not found")
        return Response(response_body(turn, output=selectors.response_output(response=turn)))


class PermissionListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": MANAGE, "PUT": MANAGE}

    @extend_schema(
        parameters=[OpenApiParameter("limit", int), OpenApiParameter("after", str)],
        responses=dict,
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_limit=100, default_order="asc")
        grants = Permission.objects.filter(session=self.session).select_related("user")
        if params.after:
            grants = grants.filter(user__username__gt=params.after)
        rows = list(grants.order_by("user__username")[: params.limit + 1])
        more = len(rows) > params.limit
        rows = rows[: params.limit]
        return Response(
            {
                "permissions": [grant_body(grant) for grant in rows],
                "next_cursor": rows[-1].user.get_username() if more else None,
            }
        )

    @extend_schema(request=PermissionGrantSerializer, responses=GrantOutSerializer)
    def put(self, request: Request, session_id: str) -> Response:
        serializer = PermissionGrantSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        grant = services.grant_permission(
            session=self.session,
            actor=request_user(request),
            user_id=serializer.validated_data["user_id"],
            level=serializer.validated_data["level"],
        )
        return Response({**grant_body(grant), "session_id": grant.session_id})


class PermissionDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    def required_session_level(self, request: Request) -> int:
        leaving = self.kwargs.get("user_id") == request.user.get_username()
        return READ if leaving else MANAGE

    @extend_schema(responses={204: OpenApiResponse(description="revoked")})
    def delete(self, request: Request, session_id: str, user_id: str) -> Response:
        services.revoke_permission(session=self.session, user_id=user_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=dict)
    def get(self, request: Request) -> Response:
        return Response(
            {"user_id": request.user.get_username(), "is_admin": is_admin(request.user)}
        )
