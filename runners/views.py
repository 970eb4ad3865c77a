"""Runner endpoints (http-api.md, Runners)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.timeutil import unix
from sessions.serializers import StrictSerializer

from . import selectors, services
from .models import Runner


class RunnerCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=128, allow_blank=True, required=False, default="")


class RunnerCreatedSerializer(serializers.Serializer):
    runner_id = serializers.CharField()
    name = serializers.CharField()
    binding_token = serializers.CharField()


class RunnerOutSerializer(serializers.Serializer):
    runner_id = serializers.CharField()
    name = serializers.CharField()
    online = serializers.BooleanField()
    last_seen_at = serializers.IntegerField(allow_null=True)
    connected_at = serializers.IntegerField(allow_null=True)
    runner_version = serializers.CharField()


class RunnerStatusSerializer(serializers.Serializer):
    runner_id = serializers.CharField()
    online = serializers.BooleanField()


class RunnerDeletedSerializer(serializers.Serializer):
    runner_id = serializers.CharField()
    object = serializers.CharField()
    deleted = serializers.BooleanField()


def runner_body(runner: Runner) -> dict:
    return {
        "runner_id": runner.id,
        "name": runner.name,
        "online": runner.online,
        "last_seen_at": unix(runner.last_seen_at),
        "connected_at": unix(runner.connected_at),
        "runner_version": runner.runner_version,
    }


class RunnerListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=RunnerOutSerializer(many=True))
    def get(self, request: Request) -> Response:
        runners = selectors.active_runners_visible_to(user=request_user(request))
        return Response({"object": "list", "data": [runner_body(r) for r in runners]})

    @extend_schema(request=RunnerCreateSerializer, responses={201: RunnerCreatedSerializer})
    def post(self, request: Request) -> Response:
        serializer = RunnerCreateSerializer(data=request.data if request.data else {})
        serializer.is_valid(raise_exception=True)
        runner, token = services.register_runner(
            owner=request_user(request), name=serializer.validated_data["name"]
        )
        return Response(
            {"runner_id": runner.id, "name": runner.name, "binding_token": token},
            status=status.HTTP_201_CREATED,
        )


class RunnerStatusView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=RunnerStatusSerializer)
    def get(self, request: Request, runner_id: str) -> Response:
        online = selectors.runner_is_online(user=request_user(request), runner_id=runner_id)
        return Response({"runner_id": runner_id, "online": online})


class RunnerDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=RunnerOutSerializer)
    def get(self, request: Request, runner_id: str) -> Response:
        runner = selectors.runner_for(user=request_user(request), runner_id=runner_id)
        return Response(runner_body(runner))

    @extend_schema(responses=RunnerDeletedSerializer)
    def delete(self, request: Request, runner_id: str) -> Response:
        runner = selectors.runner_for(user=request_user(request), runner_id=runner_id)
        services.revoke_runner(runner=runner)
        return Response({"runner_id": runner_id, "object": "runner.deleted", "deleted": True})
