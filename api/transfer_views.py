"""``GET /v1/sessions/{id}/export`` and ``POST /v1/sessions/import`` (lifecycle.md, Export
and import). The work is in ``sessions.transfer``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.parsers import MultiPartParser
from omnigent_site.schema import error_responses
from sessions import selectors, transfer
from sessions.permissions import OWNER, READ, SessionAccess, SessionScopedMixin
from sessions.shapes import SessionOut, session_body
from workspaces.serializers import query_flag

from .views import require_content_type

IMPORT_UPLOAD = {
    "type": "object",
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "an export (NDJSON)"},
        "agent_id": {"type": "string", "description": "the agent of the new session"},
    },
    "required": ["file"],
}


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


async def _on_threads(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` served from the event loop, each read on a thread when it is due:
    Django would read a plain iterator whole before sending the first byte."""
    while True:
        chunk = await sync_to_async(_next_chunk)(chunks)
        if chunk is None:
            return
        yield chunk


class SessionExportView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ}

    @extend_schema(
        operation_id="sessions_export",
        parameters=[OpenApiParameter("files", bool, description="include the session's files")],
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.STR,
                description="session_meta, then item, turn and (files=1) file lines",
            ),
            **error_responses(400, 401, 404),
        },
    )
    def get(self, request: Request, session_id: str) -> StreamingHttpResponse:
        with_files = query_flag(request.query_params, "files")
        transfer.record_export(
            session=self.session, user=request_user(request), with_files=with_files
        )
        chunks = transfer.export_chunks(
            session=self.session, level=self.session_level, with_files=with_files
        )
        # Under ASGI (daphne) an async iterator; the WSGI test client reads a plain one.
        body = _on_threads(chunks) if isinstance(request._request, ASGIRequest) else chunks
        response = StreamingHttpResponse(body, content_type="application/x-ndjson; charset=utf-8")
        name = quote(f"{self.session.id}.jsonl")
        response["Content-Disposition"] = f"attachment; filename*=UTF-8''{name}"
        response["Cache-Control"] = "no-store"
        response["X-Content-Type-Options"] = "nosniff"
        return response


class SessionImportView(APIView):
    parser_classes = [MultiPartParser]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="sessions_import",
        request={"multipart/form-data": IMPORT_UPLOAD},
        responses={201: SessionOut, **error_responses(400, 401, 404, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        require_content_type(request, "multipart/form-data")
        upload: Any = request.FILES.get("file")
        if upload is None:
            raise ValidationError({"file": ["missing multipart part 'file' (a file upload)"]})
        user = request_user(request)
        agent = None
        data: Any = request.data
        agent_id = data.get("agent_id")
        if agent_id:
            if not isinstance(agent_id, str):
                raise ValidationError({"agent_id": ["must be a string"]})
            agent = selectors.agent_for(agent_id=agent_id, user=user)
        session = transfer.import_session(user=user, upload=upload, size=upload.size, agent=agent)
        return Response(
            session_body(session, level=OWNER, items=selectors.session_items(session=session)),
            status=status.HTTP_201_CREATED,
        )
