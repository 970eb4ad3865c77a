"""Runner endpoints (http-api.md, Runners)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.schema import error_responses
from runners import selectors, services
from runners.serializers import RunnerCreateSerializer
from runners.shapes import (
    RunnerCreatedOut,
    RunnerDeletedOut,
    RunnerList,
    RunnerOut,
    RunnerStatusOut,
    runner_body,
    runner_created_body,
    runner_deleted_body,
    runner_list_body,
    runner_status_body,
)


class RunnerListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(operation_id="runners_list", responses={200: RunnerList, **error_responses(401)})
    def get(self, request: Request) -> Response:
        runners = selectors.active_runners_visible_to(user=request_user(request))
        return Response(runner_list_body(runners))

    @extend_schema(
        request=RunnerCreateSerializer,
        responses={201: RunnerCreatedOut, **error_responses(400, 401, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        serializer = RunnerCreateSerializer(data=request.data if request.data else {})
        serializer.is_valid(raise_exception=True)
        runner, token = services.register_runner(
            owner=request_user(request), name=serializer.validated_data["name"]
        )
        server_url = request.build_absolute_uri("/").rstrip("/")
        body = runner_created_body(runner, token=token, server_url=server_url)
        return Response(body, status=status.HTTP_201_CREATED)


class RunnerStatusView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: RunnerStatusOut, **error_responses(401)})
    def get(self, request: Request, runner_id: str) -> Response:
        online = selectors.runner_is_online(user=request_user(request), runner_id=runner_id)
        return Response(runner_status_body(runner_id, online=online))


class RunnerDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: RunnerOut, **error_responses(401, 404)})
    def get(self, request: Request, runner_id: str) -> Response:
        runner = selectors.runner_for(user=request_user(request), runner_id=runner_id)
        return Response(runner_body(runner))

    @extend_schema(responses={200: RunnerDeletedOut, **error_responses(401, 404)})
    def delete(self, request: Request, runner_id: str) -> Response:
        runner = selectors.runner_for(user=request_user(request), runner_id=runner_id)
        services.revoke_runner(runner=runner, actor=request_user(request))
        return Response(runner_deleted_body(runner_id))
