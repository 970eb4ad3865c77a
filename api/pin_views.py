"""``PUT``/``DELETE /v1/sessions/{id}/pin``: a session pinned in the caller's own list
(docs/web.md, Sidebar). Any grant may pin: it is the reader's choice, kept on their
grant, and shows as ``pinned`` on their list rows only."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.schema import error_responses
from sessions import services
from sessions.permissions import READ, SessionAccess, SessionScopedMixin
from sessions.shapes import SessionPinOut, session_pin_body


class SessionPinView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"PUT": READ, "DELETE": READ}
    session_with_agent = False

    @extend_schema(
        operation_id="sessions_pin",
        request=None,
        responses={200: SessionPinOut, **error_responses(401, 403, 404)},
    )
    def put(self, request: Request, session_id: str) -> Response:
        pinned = services.set_pinned(session=self.session, user=request_user(request), pinned=True)
        return Response(session_pin_body(self.session.id, pinned=pinned))

    @extend_schema(
        operation_id="sessions_unpin",
        request=None,
        responses={200: SessionPinOut, **error_responses(401, 403, 404)},
    )
    def delete(self, request: Request, session_id: str) -> Response:
        pinned = services.set_pinned(session=self.session, user=request_user(request), pinned=False)
        return Response(session_pin_body(self.session.id, pinned=pinned))
