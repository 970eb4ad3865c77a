"""Approval and policy endpoints that act on the session's runner (approvals.md).

``POST .../elicitations/{eid}/resolve`` stores a verdict and relays it; ``GET|PUT
.../policies`` reads and replaces the session's rules, and a change is sent to a runner
already running the session. Async views, like ``POST .../events``: a relay waits up to
``OMNIGENT_RELAY_TIMEOUT_S`` for the runner without holding a request thread. Reads of
approvals are in ``elicitation_views.py``. The work is in ``runners/verdicts.py``.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from omnigent_site.async_views import AsyncAPIView, RenderJSONOnLoopMixin
from omnigent_site.authentication import request_user
from omnigent_site.schema import error_responses
from runners import verdicts
from sessions.approval_shapes import (
    ElicitationResolveOut,
    PolicyList,
    elicitation_resolve_body,
    policy_list_body,
)
from sessions.permissions import EDIT, MANAGE, READ, SessionAccess, SessionScopedMixin
from sessions.serializers import ElicitationResolveSerializer, PolicyUpdateSerializer


class ElicitationResolveView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_with_agent = False
    session_levels = {"POST": EDIT}

    @extend_schema(
        request=ElicitationResolveSerializer,
        responses={
            202: OpenApiResponse(ElicitationResolveOut, description="The verdict is stored."),
            **error_responses(400, 401, 403, 404, 409, 413, 415),
        },
    )
    async def post(
        self, request: Request, session_id: str, elicitation_id: str
    ) -> HttpResponseBase:
        serializer = ElicitationResolveSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        await verdicts.answer_elicitation(
            session=self.session,
            approval_id=elicitation_id,
            action=values["action"],
            reason=values.get("reason"),
            user=request_user(request),
            content=values.get("content"),
        )
        return self.render_now(elicitation_resolve_body(), status=status.HTTP_202_ACCEPTED)


class SessionPoliciesView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ, "PUT": MANAGE}

    @extend_schema(responses={200: PolicyList, **error_responses(401, 404)})
    async def get(self, request: Request, session_id: str) -> HttpResponseBase:
        rules, own = await sync_to_async(verdicts.effective_policies)(session=self.session)
        return self.render_now(
            policy_list_body(rules, session_rule_count=own), status=status.HTTP_200_OK
        )

    @extend_schema(
        request=PolicyUpdateSerializer,
        responses={200: PolicyList, **error_responses(400, 401, 403, 404, 413, 415)},
    )
    async def put(self, request: Request, session_id: str) -> HttpResponseBase:
        raw = request.data.get("rules") if isinstance(request.data, dict) else None
        rules, own = await verdicts.replace_policies(
            session=self.session, user=request_user(request), raw=raw
        )
        return self.render_now(
            policy_list_body(rules, session_rule_count=own), status=status.HTTP_200_OK
        )
