"""Approval and policy endpoints that act on the session's runner (approvals.md).

``POST .../elicitations/{eid}/resolve`` stores a verdict and relays it; ``GET|PUT
.../policies`` reads and replaces the session's rules, and a change is sent to a runner
already running the session. Async views, like ``POST .../events``: a relay waits up to
``OMNIGENT_RELAY_TIMEOUT_S`` for the runner without holding a request thread. Reads of
approvals that never reach a runner are in ``sessions/approval_views.py``.
"""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User as AuthUser
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from omnigent_runner.protocol import PolicyRule, PolicyUpdate
from omnigent_site.async_views import AsyncAPIView, RenderJSONOnLoopMixin
from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import AgentUnavailable, Conflict
from omnigent_site.schema import error_responses
from sessions import approvals, policies
from sessions.approval_shapes import (
    ElicitationResolveOut,
    PolicyList,
    elicitation_resolve_body,
    policy_list_body,
)
from sessions.blobs import BundleMissing
from sessions.models import Session
from sessions.permissions import EDIT, MANAGE, READ, SessionAccess, SessionScopedMixin
from sessions.serializers import ElicitationResolveSerializer, PolicyUpdateSerializer

from .relay import RelayError, send_command
from .verdicts import relay_verdict

log = logging.getLogger(__name__)


async def answer_elicitation(
    *, session: Session, approval_id: str, action: object, reason: str | None, user: AuthUser
) -> None:
    """Store the verdict, then relay it (approvals.md, Answering).

    Stored first: a runner that is offline, or does not answer within the relay's
    deadline, gets it with ``session.open`` when it reconnects, so this never
    answers 503. The same action again changes nothing; another one is a 409.
    """
    resolution = await sync_to_async(approvals.resolve)(
        session_id=session.id,
        approval_id=approval_id,
        action=approvals.check_action(action),
        user=user,
        reason=reason,
    )
    approval = resolution.approval
    if resolution.stored:
        await relay_verdict(session=session, approval=approval)
    if resolution.conflict:
        raise Conflict(
            f"elicitation {approval.id!r} is already {approval.status}: the first verdict stands"
        )


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
        await answer_elicitation(
            session=self.session,
            approval_id=elicitation_id,
            action=values["action"],
            reason=values.get("reason"),
            user=request_user(request),
        )
        return self.render_now(elicitation_resolve_body(), status=status.HTTP_202_ACCEPTED)


def _effective(session: Session) -> tuple[list[PolicyRule], int]:
    try:
        return policies.effective(session=session)
    except BundleMissing as exc:
        log.error("session %s: %s", session.id, exc)
        raise AgentUnavailable(str(exc)) from exc


async def _send_rules(session: Session, rules: list[PolicyRule]) -> None:
    """Best effort: a runner running the session applies the rules from its next tool
    call. An offline runner gets them with ``session.open``."""
    runner = session.runner
    if runner is None or not runner.online:
        return
    try:
        await send_command(
            channel_name=runner.channel_name,
            command=PolicyUpdate(session_id=session.id, rules=rules),
        )
    except RelayError as exc:
        log.info("policy.update for %s not delivered: %s", session.id, exc.message)


class SessionPoliciesView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ, "PUT": MANAGE}

    @extend_schema(responses={200: PolicyList, **error_responses(401, 404)})
    async def get(self, request: Request, session_id: str) -> HttpResponseBase:
        rules, own = await sync_to_async(_effective)(self.session)
        return self.render_now(
            policy_list_body(rules, session_rule_count=own), status=status.HTTP_200_OK
        )

    @extend_schema(
        request=PolicyUpdateSerializer,
        responses={200: PolicyList, **error_responses(400, 401, 403, 404, 413, 415)},
    )
    async def put(self, request: Request, session_id: str) -> HttpResponseBase:
        raw = request.data.get("rules") if isinstance(request.data, dict) else None
        session = await sync_to_async(policies.replace_session_rules)(
            session=self.session, user=request_user(request), raw=raw
        )
        rules, own = await sync_to_async(_effective)(session)
        await _send_rules(session, rules)
        return self.render_now(
            policy_list_body(rules, session_rule_count=own), status=status.HTTP_200_OK
        )
