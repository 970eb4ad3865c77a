"""Changes and diff of a session's workspace, served from stored records (http-api.md)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.schema import error_responses
from sessions.permissions import SessionAccess, SessionScopedMixin
from workspaces.selectors import session_changes
from workspaces.serializers import check_environment, check_relative_path
from workspaces.shapes import ChangeList, FileDiffOut, change_list_body, file_diff_body


class ChangesView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses={200: ChangeList, **error_responses(401, 404)})
    def get(self, request: Request, session_id: str, env: str) -> Response:
        check_environment(env)
        return Response(change_list_body(session_changes(session=self.session, environment_id=env)))


class DiffView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses={200: FileDiffOut, **error_responses(400, 401, 404)})
    def get(self, request: Request, session_id: str, env: str, path: str) -> Response:
        check_environment(env)
        check_relative_path(path)
        change = session_changes(session=self.session, environment_id=env).filter(path=path).first()
        if change is None:
            raise NotFound(f"{path!r} is not in the session's change set")
        return Response(file_diff_body(change))
