"""``GET /v1/usage`` (docs/usage.md, Reports): the reference's usage report of the
caller's sessions, or with ``?group_by=`` sums per model, agent, day, session or user.

Everything is read from the pre-summed rows of ``usage`` (per user, UTC day, model and
agent; per session, day and model), never from the calls, so a year of one user's
usage is a few thousand rows at most.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import Forbidden
from omnigent_site.renderers import JSONRenderer
from omnigent_site.schema import error_responses
from omnigent_site.timeutil import unix
from sessions.models import Session
from usage import selectors
from usage import services as usage_services
from usage.report import UsageGroupOut, UsageGroupsOut, UsageReportOut
from usage.shapes import usd

GROUPS = ("day", "model", "agent", "session", "user")
DAILY_COSTS_DEFAULT_DAYS = 30
MAX_RANGE_DAYS = 3660
MAX_SESSIONS = 200


class UsageQuerySerializer(serializers.Serializer):
    since = serializers.DateField(required=False, input_formats=["iso-8601"])
    until = serializers.DateField(required=False, input_formats=["iso-8601"])
    group_by = serializers.ChoiceField(choices=GROUPS, required=False)
    user = serializers.CharField(required=False, max_length=254)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None:
            if since > until:
                raise serializers.ValidationError({"until": ["must not be before since"]})
            if (until - since).days > MAX_RANGE_DAYS:
                raise serializers.ValidationError(
                    {"until": [f"the range is at most {MAX_RANGE_DAYS} days"]}
                )
        return attrs


class UsageView(APIView):
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="usage_report",
        parameters=[
            OpenApiParameter("since", str, description="first UTC day (YYYY-MM-DD), inclusive"),
            OpenApiParameter("until", str, description="last UTC day (YYYY-MM-DD), inclusive"),
            OpenApiParameter(
                "group_by",
                {"type": "string", "enum": list(GROUPS)},
                description="sums per group instead of the report (`user`: staff only)",
            ),
            OpenApiParameter("user", str, description="another user's usage (staff only)"),
        ],
        responses={200: UsageReportOut | UsageGroupsOut, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        query = UsageQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        params = query.validated_data
        caller = request_user(request)
        staff = bool(caller.is_staff or caller.is_superuser)
        group = params.get("group_by")
        if ("user" in params or group == "user") and not staff:
            raise Forbidden("only staff see other users' usage")
        user_ids: list[int] | None = [caller.pk]
        if "user" in params:
            user_ids = [_user_pk(params["user"])]
        elif group == "user":
            user_ids = None  # everyone
        since, until = params.get("since"), params.get("until")
        if group is not None:
            return Response(_groups(group, user_ids=user_ids, since=since, until=until))
        return Response(_report(user_ids=user_ids or [], since=since, until=until))


def _user_pk(username: str) -> int:
    User = get_user_model()
    pk = User.objects.filter(**{User.USERNAME_FIELD: username}).values_list("pk", flat=True)
    found = list(pk[:1])
    if not found:
        raise serializers.ValidationError({"user": [f"unknown user {username!r}"]})
    return int(found[0])


def _groups(
    group: str, *, user_ids: list[int] | None, since: date | None, until: date | None
) -> UsageGroupsOut:
    rows = selectors.grouped(group, user_ids=user_ids, since=since, until=until)
    names: dict[Any, str] = {}
    if group == "user":
        User = get_user_model()
        names = dict(
            User.objects.filter(pk__in=[row[0] for row in rows]).values_list(
                "pk", User.USERNAME_FIELD
            )
        )
    data: list[UsageGroupOut] = []
    for key, *values in rows:
        sums = dict(zip(selectors.GROUPED_FIELDS, values, strict=True))
        if group == "user":
            key = names.get(key, str(key))
        data.append(
            {
                "key": key.isoformat() if isinstance(key, date) else str(key),
                "input_tokens": sums["input_tokens"],
                "output_tokens": sums["output_tokens"],
                "total_tokens": sums["input_tokens"]
                + sums["cache_read_input_tokens"]
                + sums["cache_creation_input_tokens"]
                + sums["output_tokens"],
                "cost_usd": usd(sums["cost_nano"]) if sums["priced_calls"] else None,
            }
        )
    return {"object": "list", "data": data}


def _report(*, user_ids: list[int], since: date | None, until: date | None) -> UsageReportOut:
    today = usage_services.clock().date()
    last = until or today
    first = since or last - timedelta(days=DAILY_COSTS_DEFAULT_DAYS - 1)
    if (last - first).days > MAX_RANGE_DAYS:
        raise serializers.ValidationError(
            {"since": [f"the range is at most {MAX_RANGE_DAYS} days"]}
        )
    per_day = selectors.cost_per_day(user_ids=user_ids, since=first, until=last)
    recent = selectors.cost_per_day(
        user_ids=user_ids, since=today - timedelta(days=29), until=today
    )

    def since_days(days: int) -> int:
        start = today - timedelta(days=days - 1)
        return sum(cost for day, cost in recent.items() if day >= start)

    costs = selectors.session_costs(user_ids=user_ids, since=since, until=until)
    sessions = (
        Session.objects.filter(pk__in=list(costs))
        .select_related("agent")
        .order_by("-updated_at")[:MAX_SESSIONS]
    )
    return {
        "object": "usage_report",
        "cost_today": usd(recent.get(today, 0)),
        "cost_last_7d": usd(since_days(7)),
        "cost_last_30d": usd(since_days(30)),
        "total_cost_usd": usd(selectors.total_cost(user_ids=user_ids, since=since, until=until)),
        "daily_costs": [
            {"day": day.isoformat(), "cost_usd": usd(per_day.get(day, 0))}
            for day in (first + timedelta(days=n) for n in range((last - first).days + 1))
        ],
        "sessions": [
            {
                "id": session.id,
                "title": session.title,
                "created_at": unix(session.created_at) or 0,
                "updated_at": unix(session.updated_at) or 0,
                "cost_usd": usd(sum(costs[session.id].values())),
                "models": {model: usd(cost) for model, cost in costs[session.id].items()},
                "agent_name": session.agent.name,
            }
            for session in sessions
        ],
    }
