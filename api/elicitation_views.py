"""Reading a session's approvals (approvals.md, Answering): read access, no runner.

Answering them acts on the runner: ``approval_views.py``.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.pagination import paginate, parse_list_params
from omnigent_site.schema import error_responses, list_parameters
from sessions import selectors
from sessions.approval_shapes import ElicitationOut, ElicitationPage, elicitation_body
from sessions.permissions import SessionAccess, SessionScopedMixin

STATUS_FILTERS = ("pending", "resolved")


class ElicitationListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False

    @extend_schema(
        operation_id="sessions_elicitations_list",
        parameters=[
            *list_parameters(default_limit=20, default_order="asc"),
            OpenApiParameter(
                "status",
                {"type": "string", "enum": list(STATUS_FILTERS)},
                description="`pending` (no verdict yet) or `resolved`; all when left out",
            ),
        ],
        responses={200: ElicitationPage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_order="asc")
        wanted = request.query_params.get("status") or None
        if wanted is not None and wanted not in STATUS_FILTERS:
            raise ValidationError({"status": ["must be 'pending' or 'resolved'"]})
        page = paginate(
            selectors.session_approvals(session=self.session, status=wanted),
            params,
            sort_field="created_at",
        )
        return Response(page.body(elicitation_body, lambda approval: approval.id))


class ElicitationDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False

    @extend_schema(responses={200: ElicitationOut, **error_responses(401, 404)})
    def get(self, request: Request, session_id: str, elicitation_id: str) -> Response:
        approval = (
            selectors.session_approvals(session=self.session).filter(pk=elicitation_id).first()
        )
        if approval is None:
            raise NotFound(f"elicitation {elicitation_id!r} not found")
        return Response(elicitation_body(approval))
