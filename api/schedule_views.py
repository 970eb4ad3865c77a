"""Scheduled tasks (automation.md, Schedules), at the reference's paths
``/v1/scheduled-tasks…``. Thin: parse, find the caller's task, call ``schedules``.

``POST …/run`` is async: it fires the run as the firing loop would and waits for the
runner's acknowledgement without holding a request thread (as the events view does).
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from asgiref.sync import sync_to_async
from django.http import HttpResponseBase
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.async_views import AsyncAPIView, RenderJSONOnLoopMixin
from omnigent_site.authentication import request_user
from omnigent_site.pagination import parse_list_params
from omnigent_site.schema import error_responses
from runners import liveness
from schedules import clock, firing, selectors, services
from schedules.models import ScheduledRun
from schedules.serializers import (
    ScheduledTaskCreateSerializer,
    ScheduledTaskUpdateSerializer,
    SchedulePreviewSerializer,
)
from schedules.shapes import (
    ScheduledRunList,
    ScheduledRunOut,
    ScheduledTaskDeletedOut,
    ScheduledTaskList,
    ScheduledTaskOut,
    SchedulePreviewOut,
    preview_body,
    run_body,
    run_list_body,
    task_body,
    task_deleted_body,
    task_list_body,
)

CURSOR_PARAMETERS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 20}),
    OpenApiParameter("after", str, description="cursor: `next_cursor` of the previous page"),
]


class ScheduledTaskListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="scheduled_tasks_list",
        parameters=CURSOR_PARAMETERS,
        responses={200: ScheduledTaskList, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        params = parse_list_params(request.query_params)
        tasks, cursor = selectors.page_after(
            selectors.tasks_of(user=request_user(request)),
            after=params.after,
            limit=params.limit,
            time_field="created_at",
        )
        return Response(task_list_body(tasks, next_cursor=cursor))

    @extend_schema(
        request=ScheduledTaskCreateSerializer,
        responses={201: ScheduledTaskOut, **error_responses(400, 401, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        serializer = ScheduledTaskCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = services.create_task(
            owner=request_user(request), now=clock.now(), **serializer.validated_data
        )
        return Response(task_body(task), status=status.HTTP_201_CREATED)


class ScheduledTaskPreviewView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=SchedulePreviewSerializer,
        responses={200: SchedulePreviewOut, **error_responses(400, 401, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        """The next five occurrences of a rule in a zone (the page's preview); a bad rule
        or zone is the 400 a create would answer."""
        serializer = SchedulePreviewSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        times = services.preview(
            rrule=values["rrule"], timezone=values["timezone"], now=clock.now()
        )
        return Response(preview_body(times, zone=ZoneInfo(values["timezone"])))


class ScheduledTaskDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: ScheduledTaskOut, **error_responses(401, 404)})
    def get(self, request: Request, task_id: str) -> Response:
        return Response(task_body(selectors.task_for(user=request_user(request), task_id=task_id)))

    @extend_schema(
        request=ScheduledTaskUpdateSerializer,
        responses={200: ScheduledTaskOut, **error_responses(400, 401, 404, 413, 415)},
    )
    def patch(self, request: Request, task_id: str) -> Response:
        task = selectors.task_for(user=request_user(request), task_id=task_id)
        serializer = ScheduledTaskUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = services.update_task(task=task, now=clock.now(), **serializer.validated_data)
        return Response(task_body(task))

    @extend_schema(responses={200: ScheduledTaskDeletedOut, **error_responses(401, 404)})
    def delete(self, request: Request, task_id: str) -> Response:
        task = selectors.task_for(user=request_user(request), task_id=task_id)
        services.delete_task(task=task)
        return Response(task_deleted_body(task_id))


class ScheduledRunListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="scheduled_task_runs_list",
        parameters=CURSOR_PARAMETERS,
        responses={200: ScheduledRunList, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, task_id: str) -> Response:
        task = selectors.task_for(user=request_user(request), task_id=task_id)
        params = parse_list_params(request.query_params)
        runs, cursor = selectors.page_after(
            selectors.runs_of(task=task),
            after=params.after,
            limit=params.limit,
            time_field="scheduled_for",
        )
        return Response(run_list_body(runs, zone=ZoneInfo(task.timezone), next_cursor=cursor))


class ScheduledTaskRunView(RenderJSONOnLoopMixin, AsyncAPIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(
                ScheduledRunOut,
                description="The run: `running` once the runner took the message, or "
                "`skipped`/`failed` with the reason.",
            ),
            **error_responses(401, 404, 409),
        },
    )
    async def post(self, request: Request, task_id: str) -> HttpResponseBase:
        run = await sync_to_async(self.claim)(request, task_id)
        await firing.fire(run.id, to_thread=sync_to_async)
        body = await sync_to_async(self.rendered)(run.id)
        return self.render_now(body, status=status.HTTP_202_ACCEPTED)

    def claim(self, request: Request, task_id: str) -> ScheduledRun:
        task = selectors.task_for(user=request_user(request), task_id=task_id)
        return services.claim_manual_run(task=task, now=clock.now(), process_id=liveness.PROCESS_ID)

    def rendered(self, run_id: str) -> Any:
        run = ScheduledRun.objects.select_related("task").get(pk=run_id)
        return run_body(run, zone=ZoneInfo(run.task.timezone))
