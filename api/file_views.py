"""Session files (``…/resources/files``) and fork (``POST …/fork``): files.md §1 and §3.

Thin: parse, authorize (``SessionAccess``), call ``files`` / ``fork``, render.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import NotFound
from omnigent_site.pagination import paginate, parse_list_params
from omnigent_site.parsers import JSONParser
from omnigent_site.schema import error_responses, list_parameters
from sessions import file_store, file_types, files, fork, selectors
from sessions.file_upload import SessionFileParser, SessionFileUpload
from sessions.permissions import EDIT, OWNER, READ, SessionAccess, SessionScopedMixin
from sessions.serializers import ForkSerializer
from sessions.shapes import (
    SessionFileDeletedOut,
    SessionFileOut,
    SessionFilePage,
    SessionOut,
    session_body,
    session_file_body,
    session_file_deleted_body,
)

from .views import require_content_type

FILE_UPLOAD = {
    "type": "object",
    "properties": {"file": {"type": "string", "format": "binary"}},
    "required": ["file"],
}


class SessionFileListView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    parser_classes = [SessionFileParser]
    session_levels = {"GET": READ, "POST": EDIT}
    session_with_agent = False
    # Made before anything can read the body (a login session's CSRF check does, while
    # the request is authenticated); ``SessionFileParser`` streams into it.
    upload: SessionFileUpload | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if request.method == "POST":
            self.upload = SessionFileUpload(limit=int(settings.OMNIGENT_MAX_UPLOAD_BYTES))
        super().initial(request, *args, **kwargs)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        # Whatever happened (a refusal while authenticating included), no temporary bytes
        # stay behind; after a stored upload this finds nothing to remove.
        if self.upload is not None:
            self.upload.discard()
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        operation_id="sessions_files_list",
        parameters=list_parameters(default_limit=20, default_order="desc"),
        responses={200: SessionFilePage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        params = parse_list_params(request.query_params, default_order="desc")
        page = paginate(files.session_files(session=self.session), params, sort_field="created_at")
        return Response(page.body(session_file_body, lambda file: file.id))

    @extend_schema(
        request={"multipart/form-data": FILE_UPLOAD},
        responses={201: SessionFileOut, **error_responses(400, 401, 403, 404, 413, 415)},
    )
    def post(self, request: Request, session_id: str) -> Response:
        require_content_type(request, "multipart/form-data")
        upload = self.upload
        assert upload is not None  # set by ``initial``
        unknown = sorted(set(request.data) - {"file"})
        if unknown:
            raise ValidationError({part: ["unknown multipart part"] for part in unknown})
        if "file" not in request.FILES:
            if "file" in request.data:
                raise ValidationError({"file": ["the file part must be a file upload"]})
            raise ValidationError({"file": ["missing multipart part 'file'"]})
        # The view's handler took the part (``FILES`` holds its stand-in): name checked, bytes
        # written.
        assert upload.writer is not None and upload.name is not None
        row = files.add_session_file(
            session=self.session, user=request_user(request), name=upload.name, writer=upload.writer
        )
        return Response(session_file_body(row), status=status.HTTP_201_CREATED)


class SessionFileDetailView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ, "DELETE": EDIT}
    session_with_agent = False

    @extend_schema(responses={200: SessionFileOut, **error_responses(401, 404)})
    def get(self, request: Request, session_id: str, file_id: str) -> Response:
        return Response(
            session_file_body(files.session_file(session=self.session, file_id=file_id))
        )

    @extend_schema(responses={200: SessionFileDeletedOut, **error_responses(401, 403, 404)})
    def delete(self, request: Request, session_id: str, file_id: str) -> Response:
        row = files.session_file(session=self.session, file_id=file_id)
        files.delete_session_file(session=self.session, file=row, actor=request_user(request))
        return Response(session_file_deleted_body(file_id))


def content_disposition(name: str) -> str:
    """``attachment`` with an ASCII fallback name and the exact name (RFC 6266 / 5987)."""
    fallback = re.sub(r'[^\x20-\x7e]|["\\]', "_", name) or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _etag_matches(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    tags = [tag.strip() for tag in header.split(",")]
    return any(tag.removeprefix("W/") == etag for tag in tags)


class SessionFileContentView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ}
    session_with_agent = False

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The bytes are not rendered, so any ``Accept`` (``application/octet-stream``,
        # ``image/*``) is fine; an error body is JSON whatever was asked for.
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        responses={
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The bytes, as an attachment, with the file's content type.",
            ),
            304: OpenApiResponse(description="`If-None-Match` matched the ETag."),
            **error_responses(401, 404),
        }
    )
    def get(self, request: Request, session_id: str, file_id: str) -> HttpResponseBase:
        row = files.session_file(session=self.session, file_id=file_id)
        etag = f'"{row.sha256}"'
        headers = {
            "ETag": etag,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, no-cache",
        }
        if _etag_matches(request.headers.get("If-None-Match", ""), etag):
            not_modified = HttpResponse(status=304)
            for key, value in headers.items():
                not_modified[key] = value
            return not_modified
        content_type = file_types.served_type(row.content_type)
        try:
            handle = file_store.open_blob(row.sha256)
        except FileNotFoundError:
            raise NotFound(f"the bytes of file {file_id!r} are missing") from None
        response = FileResponse(handle, content_type=content_type)
        response["Content-Length"] = str(row.bytes)
        response["Content-Disposition"] = content_disposition(row.name)
        for key, value in headers.items():
            response[key] = value
        return response


class SessionForkView(SessionScopedMixin, APIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    parser_classes = [JSONParser]
    session_levels = {"POST": READ}

    @extend_schema(
        request=ForkSerializer,
        responses={201: SessionOut, **error_responses(400, 401, 404, 415)},
    )
    def post(self, request: Request, session_id: str) -> Response:
        serializer = ForkSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        forked = fork.fork_session(
            source=self.session,
            user=request_user(request),
            title=serializer.validated_data.get("title"),
            up_to_response_id=serializer.validated_data.get("up_to_response_id"),
        )
        return Response(
            session_body(forked, level=OWNER, items=selectors.session_items(session=forked)),
            status=status.HTTP_201_CREATED,
        )
