"""Session list and create, agent, item, response, permission and ``/me`` endpoints
(http-api.md): those that need no runner. Thin: parse, authorize, call a service or
selector of ``sessions``, render."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.exceptions import NotFound, UnsupportedMediaType, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import PayloadTooLarge
from omnigent_site.pagination import MAX_LIMIT, paginate, parse_list_params
from omnigent_site.parsers import JSONParser, MultiPartParser
from omnigent_site.schema import error_responses, list_parameters
from omnigent_site.users import is_admin
from sessions import search, selectors, services
from sessions.models import Permission, Session
from sessions.permissions import MANAGE, OWNER, READ, SessionAccess, SessionScopedMixin
from sessions.serializers import (
    BundleUploadForm,
    PermissionGrantSerializer,
    SessionCreateSerializer,
    SessionUploadForm,
    parse_metadata_part,
)
from sessions.shapes import (
    AgentDeletedOut,
    AgentOut,
    AgentPage,
    GrantListOut,
    GrantSetOut,
    InboxOut,
    ItemPage,
    MeOut,
    ResponseOut,
    ResponsePage,
    SessionAgentOut,
    SessionCreatedOut,
    SessionListRowOut,
    SessionOut,
    SessionPage,
    agent_body,
    agent_deleted_body,
    flat_item,
    grant_list_body,
    grant_set_body,
    inbox_body,
    me_body,
    response_body,
    session_agent_body,
    session_body,
    session_created_body,
    session_list_row,
)

BUNDLE_UPLOAD = {
    "type": "object",
    "properties": {"bundle": {"type": "string", "format": "binary"}},
    "required": ["bundle"],
}


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
    browsable_form = BundleUploadForm
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="agents_list",
        parameters=[
            *list_parameters(default_limit=20, default_order="desc"),
            OpenApiParameter("name", str),
        ],
        responses={200: AgentPage, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        params = parse_list_params(request.query_params)
        queryset = selectors.template_agents()
        if name := request.query_params.get("name"):
            queryset = queryset.filter(name=name)
        page = paginate(queryset, params, sort_field="created_at")
        return Response(page.body(agent_body, lambda agent: agent.id))

    @extend_schema(
        request={"multipart/form-data": BUNDLE_UPLOAD},
        responses={201: AgentOut, **error_responses(400, 401, 409, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        require_content_type(request, "multipart/form-data")
        agent = services.create_template_agent(
            data=read_bundle_part(request), user=request_user(request)
        )
        return Response(agent_body(agent), status=status.HTTP_201_CREATED)


class AgentDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: AgentOut, **error_responses(401, 404)})
    def get(self, request: Request, agent_id: str) -> Response:
        return Response(
            agent_body(selectors.agent_for(agent_id=agent_id, user=request_user(request)))
        )

    @extend_schema(responses={200: AgentDeletedOut, **error_responses(401, 403, 404)})
    def delete(self, request: Request, agent_id: str) -> Response:
        agent = selectors.agent_for(agent_id=agent_id, user=request_user(request))
        services.delete_template_agent(
            agent=agent, user=request_user(request), is_admin=is_admin(request.user)
        )
        return Response(agent_deleted_body(agent_id))


# --- sessions ---------------------------------------------------------------------

# One 201 status, two bodies: which one depends on the request's Content-Type.
SESSION_CREATED = PolymorphicProxySerializer(
    component_name="SessionCreateReply",
    # Shapes, not serializers: omnigent_site.schema.TypedDictShapes maps them (the stubs
    # only know serializers).
    serializers=[SessionOut, SessionCreatedOut],  # type: ignore[list-item]
    resource_type_field_name=None,
)


class SessionListView(APIView):
    parser_classes = [JSONParser, MultiPartParser]
    browsable_form = SessionUploadForm
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="sessions_list",
        parameters=[
            *list_parameters(default_limit=20, default_order="desc"),
            OpenApiParameter("agent_id", str),
            OpenApiParameter("agent_name", str),
            OpenApiParameter(
                "archived",
                {"type": "string", "enum": ["0", "1", "true", "false"], "default": "0"},
                description="`1`: only archived sessions; by default they are hidden",
            ),
            OpenApiParameter(
                "pinned",
                {"type": "string", "enum": ["0", "1", "true", "false"]},
                description="`1`: only the sessions the caller pinned; `0`: only the others; "
                "absent: both",
            ),
            OpenApiParameter(
                "sort_by",
                {"type": "string", "enum": ["created_at", "updated_at"], "default": "created_at"},
            ),
            OpenApiParameter(
                "search_query",
                str,
                description=(
                    "only sessions whose title or one of whose items holds every word "
                    "(as a word or a word's prefix); rows gain search_snippet and "
                    "search_item_id"
                ),
            ),
        ],
        responses={200: SessionPage, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        params = parse_list_params(request.query_params)
        sort_by = request.query_params.get("sort_by") or "created_at"
        if sort_by not in ("created_at", "updated_at"):
            raise ValidationError({"sort_by": ["must be 'created_at' or 'updated_at'"]})
        query = search.parse(request.query_params.get("search_query") or "")
        queryset = selectors.sessions_granted_to(user=request_user(request))
        if agent_id := request.query_params.get("agent_id"):
            queryset = queryset.filter(agent_id=agent_id)
        if agent_name := request.query_params.get("agent_name"):
            queryset = queryset.filter(agent__name=agent_name)
        archived = request.query_params.get("archived") or "0"
        if archived not in ("0", "1", "true", "false"):
            raise ValidationError({"archived": ["must be 1 (archived only) or 0 (the default)"]})
        queryset = queryset.filter(archived_at__isnull=archived in ("0", "false"))
        pinned = request.query_params.get("pinned")
        if pinned is not None:
            if pinned not in ("0", "1", "true", "false"):
                raise ValidationError({"pinned": ["must be 1 (pinned only) or 0 (unpinned only)"]})
            queryset = selectors.pinned_filter(
                queryset, user=request_user(request), pinned=pinned in ("1", "true")
            )
        hits: dict[str, search.Hit] = {}
        if query is None:
            page = paginate(queryset, params, sort_field=sort_by)
        else:
            page, hits = search.page(queryset, query, params, sort_field=sort_by)
        session_ids = [session.id for session in page.objects]
        levels = selectors.grant_levels(user=request_user(request), session_ids=session_ids)

        def render(session: Session) -> SessionListRowOut:
            level = levels.get(session.id, 0)
            if query is None:
                return session_list_row(session, level=level)
            hit = hits.get(session.id)
            return session_list_row(
                session,
                level=level,
                search_hit=(hit.item_id, hit.snippet) if hit is not None else None,
            )

        return Response(page.body(render, lambda session: session.id))

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
        responses={
            201: OpenApiResponse(
                SESSION_CREATED,
                description="A JSON request gets the session object; a multipart request "
                "gets `{session_id, agent_id, agent_name}`.",
            ),
            **error_responses(400, 401, 404, 413, 415),
        },
    )
    def post(self, request: Request) -> Response:
        media = require_content_type(request, "application/json", "multipart/form-data")
        if media == "multipart/form-data":
            # The browsable API's form adds Django's CSRF field (a login session's check).
            unknown = sorted(set(request.data) - {"metadata", "bundle", "csrfmiddlewaretoken"})
            if unknown:
                raise ValidationError({part: ["unknown multipart part"] for part in unknown})
            assert isinstance(request.data, dict)  # multipart: a QueryDict
            metadata = parse_metadata_part(request.data.get("metadata"))
            session = services.create_session_from_bundle(
                user=request_user(request), data=read_bundle_part(request), **metadata
            )
            return Response(session_created_body(session), status=status.HTTP_201_CREATED)
        serializer = SessionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        agent = selectors.agent_for(agent_id=values.pop("agent_id"), user=request_user(request))
        session = services.create_session(user=request_user(request), agent=agent, **values)
        items = selectors.session_items(session=session)
        return Response(
            session_body(session, level=OWNER, items=items), status=status.HTTP_201_CREATED
        )


class SessionItemsView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(
        parameters=list_parameters(default_limit=100, default_order="asc"),
        responses={200: ItemPage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_limit=100, default_order="asc")
        page = paginate(
            selectors.session_items(session=self.session),
            params,
            sort_field="seq",
            cursor_field="id",
        )
        return Response(page.body(flat_item, lambda item: item.id))


class SessionAgentView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses={200: SessionAgentOut, **error_responses(401, 404)})
    def get(self, request: Request, session_id: str) -> Response:
        return Response(session_agent_body(self.session))


class ResponseListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(
        operation_id="sessions_responses_list",
        parameters=list_parameters(default_limit=20, default_order="asc"),
        responses={200: ResponsePage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_order="asc")
        page = paginate(
            selectors.session_responses(session=self.session),
            params,
            sort_field="created_at",
            cursor_field="id",
        )
        return Response(
            page.body(
                lambda turn: response_body(turn, output=selectors.response_output(response=turn)),
                lambda turn: turn.id,
            )
        )


class ResponseDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses={200: ResponseOut, **error_responses(401, 404)})
    def get(self, request: Request, session_id: str, response_id: str) -> Response:
        turn = selectors.session_responses(session=self.session).filter(id=response_id).first()
        if turn is None:
            raise NotFound(f"response {response_id!r} not found")
        return Response(response_body(turn, output=selectors.response_output(response=turn)))


class PermissionListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": MANAGE, "PUT": MANAGE}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 100},
                description=f"page size, 1 to {MAX_LIMIT}",
            ),
            OpenApiParameter("after", str, description="cursor: a user id (`next_cursor`)"),
        ],
        responses={200: GrantListOut, **error_responses(400, 401, 403, 404)},
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
            grant_list_body(rows, next_cursor=rows[-1].user.get_username() if more else None)
        )

    @extend_schema(
        request=PermissionGrantSerializer,
        responses={200: GrantSetOut, **error_responses(400, 401, 403, 404, 413, 415)},
    )
    def put(self, request: Request, session_id: str) -> Response:
        serializer = PermissionGrantSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        grant = services.grant_permission(
            session=self.session,
            actor=request_user(request),
            user_id=serializer.validated_data["user_id"],
            level=serializer.validated_data["level"],
        )
        return Response(grant_set_body(grant))


class PermissionDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    def required_session_level(self, request: Request) -> int:
        leaving = self.kwargs.get("user_id") == request.user.get_username()
        return READ if leaving else MANAGE

    @extend_schema(
        responses={
            204: OpenApiResponse(description="revoked"),
            **error_responses(401, 403, 404),
        }
    )
    def delete(self, request: Request, session_id: str, user_id: str) -> Response:
        services.revoke_permission(
            session=self.session, user_id=user_id, actor=request_user(request)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: MeOut, **error_responses(401)})
    def get(self, request: Request) -> Response:
        return Response(
            me_body(user_id=request.user.get_username(), is_admin=is_admin(request.user))
        )


class InboxView(APIView):
    """``GET /v1/inbox``: what waits for the caller across sessions (docs/web.md, Inbox)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(operation_id="inbox_retrieve", responses={200: InboxOut, **error_responses(401)})
    def get(self, request: Request) -> Response:
        approvals, failed = selectors.inbox_for(user=request_user(request))
        return Response(inbox_body(approvals, failed))
