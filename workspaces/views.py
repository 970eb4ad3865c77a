"""Changes and diff of a session's workspace, served from stored records (http-api.md)."""

from __future__ import annotations

import posixpath

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions.permissions import SessionAccess, SessionScopedMixin

from .models import FileChange
from .selectors import session_changes

ENVIRONMENTS = {"default"}


def change_body(change: FileChange) -> dict:
    return {
        "object": "session.environment.filesystem.entry",
        "path": change.path,
        "name": change.name,
        "status": change.status,
        "bytes": change.bytes,
        "modified_at": change.modified_at,
        "lines_added": change.lines_added,
        "lines_removed": change.lines_removed,
    }


def check_environment(env: str) -> str:
    if env not in ENVIRONMENTS:
        raise NotFound(f"environment {env!r} not found")
    return env


def check_relative_path(path: str) -> str:
    if not path or "\x00" in path:
        raise ValidationError({"path": ["the path is empty or contains NUL"]})
    if path.startswith("/") or posixpath.isabs(path) or (len(path) > 1 and path[1] == ":"):
        raise ValidationError({"path": ["the path must be relative to the workspace"]})
    if ".." in path.replace("\\", "/").split("/"):
        raise ValidationError({"path": ["the path must not contain '..'"]})
    return path


class ChangesView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses=dict)
    def get(self, request: Request, session_id: str, env: str) -> Response:
        check_environment(env)
        changes = session_changes(session=self.session, environment_id=env)
        return Response(
            {"object": "list", "has_more": False, "data": [change_body(c) for c in changes]}
        )


class DiffView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]

    @extend_schema(responses=dict)
    def get(self, request: Request, session_id: str, env: str, path: str) -> Response:
        check_environment(env)
        check_relative_path(path)
        change = session_changes(session=self.session, environment_id=env).filter(path=path).first()
        if change is None:
            raise NotFound(f"{path!r} is not in the session's change set")
        return Response(
            {
                "object": "session.environment.filesystem.file_diff",
                "path": change.path,
                "before": change.before,
                "after": change.after,
            }
        )
