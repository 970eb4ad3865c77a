"""The workspace through the server (files.md §2): browse, read, download, write, edit,
delete and search a session's workspace, which stays on the runner's machine.

Async views (``adrf``), like the events view: each waits on the runner with the relay's
deadline without holding a request thread. Reads need **edit** unless the session shares
its workspace files with read users (``share_workspace_files``); writes always need edit.
The path of the URL is checked here (absolute, ``..``, NUL → 400) and again, with the
symlink rules, by the runner, which is authoritative.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings

from omnigent_site.async_views import AsyncAPIView, RenderJSONOnLoopMixin
from omnigent_site.domain_errors import Forbidden, PayloadTooLarge, RunnerUnavailable
from omnigent_site.renderers import JSONRenderer
from omnigent_site.schema import error_responses
from runners import workspace_relay
from sessions.permissions import EDIT, READ, SessionAccess, SessionScopedMixin
from workspaces.serializers import (
    WorkspaceEditSerializer,
    WorkspaceWriteSerializer,
    check_environment,
    check_relative_path,
    query_flag,
    query_limit,
)
from workspaces.shapes import (
    SearchResults,
    WorkspaceEntryOut,
    WorkspaceFileOut,
    WorkspaceListing,
    search_results_body,
    workspace_entry_body,
    workspace_file_body,
    workspace_listing_body,
)

LIST_MAX_LIMIT = 1000
SEARCH_MAX_LIMIT = 500

_LISTING_PARAMETERS = [
    OpenApiParameter("limit", int, description="entries per page, 1 to 1000 (default 200)"),
    OpenApiParameter("after", str, description="the `last_id` of the previous page"),
]
_READ_CODES = (400, 401, 403, 404, 409, 503)


def _render(render: Any, result: Any) -> Any:
    """A runner's answer in its documented shape; a malformed one is the runner's failure."""
    try:
        if not isinstance(result, dict):
            raise ValueError("the runner's answer is not an object")
        return render(result)
    except ValueError as exc:
        raise RunnerUnavailable(str(exc)) from None


class OctetStreamRenderer(BaseRenderer):
    """Lets ``Accept: application/octet-stream`` negotiate for a download."""

    media_type = "application/octet-stream"
    format = "bin"
    charset = None

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return json.dumps(data).encode("utf-8")


class _WorkspaceView(RenderJSONOnLoopMixin, SessionScopedMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated, SessionAccess]
    session_levels = {"GET": READ, "PUT": EDIT, "PATCH": EDIT, "DELETE": EDIT}

    def check_read_access(self) -> None:
        """Reads need edit, unless the session shares its workspace with read users."""
        if self.session_level < EDIT and not self.session.share_workspace_files:
            raise Forbidden(
                "reading the workspace needs edit access to the session "
                "(or the session's share_workspace_files)"
            )

    def finalize_response(
        self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        # A client that accepts only bytes (a download) still gets errors as JSON.
        if isinstance(getattr(request, "accepted_renderer", None), OctetStreamRenderer):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)

    async def listing_or_file(
        self, request: Request, path: str, method: str = "workspace.read"
    ) -> HttpResponseBase:
        self.check_read_access()
        query = request.query_params
        params: dict[str, Any] = {
            "path": path,
            "max_bytes": settings.OMNIGENT_WORKSPACE_READ_MAX_BYTES,
        }
        limit = query_limit(query, maximum=LIST_MAX_LIMIT)
        if limit is not None:
            params["limit"] = limit
        if query.get("after"):
            params["after"] = query["after"]
        result = await workspace_relay.call(session=self.session, method=method, params=params)
        if isinstance(result, dict) and result.get("object") == "list":
            body = _render(workspace_listing_body, result)
        else:
            body = _render(workspace_file_body, result)
        return self.render_now(body, status=status.HTTP_200_OK)


class FilesystemRootView(_WorkspaceView):
    @extend_schema(
        operation_id="workspace_root_list",
        parameters=_LISTING_PARAMETERS,
        responses={200: WorkspaceListing, **error_responses(*_READ_CODES)},
    )
    async def get(self, request: Request, session_id: str, env: str) -> HttpResponseBase:
        check_environment(env)
        return await self.listing_or_file(request, ".", "workspace.list")


# One of two shapes (``oneOf`` in the schema); drf-spectacular maps each typed dict through
# the project's extension (``omnigent_site/schema.py``), though its stubs name serializers.
_LISTING_OR_FILE = PolymorphicProxySerializer(
    component_name="WorkspaceListingOrFile",
    serializers=[WorkspaceListing, WorkspaceFileOut],  # type: ignore[list-item]
    resource_type_field_name=None,
)


class FilesystemPathView(_WorkspaceView):
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, OctetStreamRenderer]

    @extend_schema(
        operation_id="workspace_path_read",
        parameters=[
            *_LISTING_PARAMETERS,
            OpenApiParameter(
                "download",
                bool,
                description="`1`: the whole file as an attachment (streamed in chunks)",
            ),
        ],
        responses={
            200: OpenApiResponse(
                _LISTING_OR_FILE, description="a folder's listing, or a file with its content"
            ),
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="`?download=1`: the file's bytes"
            ),
            **error_responses(*_READ_CODES),
        },
    )
    async def get(self, request: Request, session_id: str, env: str, path: str) -> HttpResponseBase:
        check_environment(env)
        check_relative_path(path)
        if not query_flag(request.query_params, "download"):
            return await self.listing_or_file(request, path)
        self.check_read_access()
        first, size, stamp = await workspace_relay.first_chunk(session=self.session, path=path)
        body = workspace_relay.rest_of_file(
            session=self.session, path=path, first=first, size=size, stamp=stamp
        )
        response = StreamingHttpResponse(body, content_type="application/octet-stream")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = content_disposition_header(
            True, path.rstrip("/").rsplit("/", 1)[-1] or "download"
        )
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(
        operation_id="workspace_path_write",
        request=WorkspaceWriteSerializer,
        responses={
            (200, "application/json"): WorkspaceEntryOut,
            **error_responses(400, 401, 403, 404, 409, 413, 503),
        },
    )
    async def put(self, request: Request, session_id: str, env: str, path: str) -> HttpResponseBase:
        check_environment(env)
        check_relative_path(path)
        serializer = WorkspaceWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        cap = settings.OMNIGENT_WORKSPACE_WRITE_MAX_BYTES
        content = values["content"]
        size = (
            len(content) * 3 // 4 - content[-2:].count("=")
            if values["encoding"] == "base64"
            else len(content.encode("utf-8", "surrogatepass"))
        )
        if size > cap:
            raise PayloadTooLarge(f"the content is over the {cap}-byte limit")
        result = await workspace_relay.call(
            session=self.session,
            method="workspace.write",
            params={
                "path": path,
                "content": content,
                "encoding": values["encoding"],
                "create_parents": values["create_parents"],
                "max_bytes": cap,
            },
        )
        return self.render_now(_render(workspace_entry_body, result), status=status.HTTP_200_OK)

    @extend_schema(
        operation_id="workspace_path_edit",
        request=WorkspaceEditSerializer,
        responses={
            (200, "application/json"): WorkspaceEntryOut,
            **error_responses(400, 401, 403, 404, 409, 503),
        },
    )
    async def patch(
        self, request: Request, session_id: str, env: str, path: str
    ) -> HttpResponseBase:
        check_environment(env)
        check_relative_path(path)
        serializer = WorkspaceEditSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = await workspace_relay.call(
            session=self.session,
            method="workspace.edit",
            params={"path": path, **serializer.validated_data},
        )
        return self.render_now(_render(workspace_entry_body, result), status=status.HTTP_200_OK)

    @extend_schema(
        operation_id="workspace_path_delete",
        parameters=[
            OpenApiParameter(
                "recursive", bool, description="`true`: delete a folder with its content"
            )
        ],
        responses={
            204: OpenApiResponse(description="Deleted."),
            **error_responses(400, 401, 403, 404, 409, 503),
        },
    )
    async def delete(
        self, request: Request, session_id: str, env: str, path: str
    ) -> HttpResponseBase:
        check_environment(env)
        check_relative_path(path)
        recursive = query_flag(request.query_params, "recursive")
        await workspace_relay.call(
            session=self.session,
            method="workspace.delete",
            params={"path": path, "recursive": recursive},
        )
        return HttpResponse(status=status.HTTP_204_NO_CONTENT)


class SearchView(_WorkspaceView):
    @extend_schema(
        operation_id="workspace_search",
        parameters=[
            OpenApiParameter("q", str, required=True, description="the text (or pattern) to find"),
            OpenApiParameter("regex", bool, description="`1`: `q` is a regular expression"),
            OpenApiParameter("path", str, description="a folder or file to search in"),
            OpenApiParameter(
                "glob", str, description="file pattern: on the name, or on the path if it has `/`"
            ),
            OpenApiParameter("limit", int, description="results, 1 to 500 (default 100)"),
        ],
        responses={200: SearchResults, **error_responses(*_READ_CODES)},
    )
    async def get(self, request: Request, session_id: str, env: str) -> HttpResponseBase:
        check_environment(env)
        self.check_read_access()
        query = request.query_params
        q = query.get("q")
        if not q:
            raise ValidationError({"q": ["the text to search for is required"]})
        params: dict[str, Any] = {"q": q, "regex": query_flag(query, "regex")}
        if query.get("path"):
            params["path"] = check_relative_path(query["path"])
        if query.get("glob"):
            params["glob"] = query["glob"]
        limit = query_limit(query, maximum=SEARCH_MAX_LIMIT)
        if limit is not None:
            params["limit"] = limit
        result = await workspace_relay.call(
            session=self.session, method="workspace.search", params=params
        )
        return self.render_now(_render(search_results_body, result), status=status.HTTP_200_OK)
