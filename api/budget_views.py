"""``GET|PUT /v1/users/{id}/budget`` (usage.md, Budgets): a user's own daily budget,
staff only. The change is audited (``sessions.budgets``) and the user's sessions with
a turn open get the new numbers (``runners.budget_updates``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.domain_errors import Forbidden, NotFound
from omnigent_site.renderers import JSONRenderer
from omnigent_site.schema import error_responses
from omnigent_site.users import is_admin
from runners import budget_updates
from sessions import budgets
from sessions.serializers import UserBudgetSerializer
from usage import selectors
from usage.shapes import UserBudgetOut, user_budget_body


class UserBudgetView(APIView):
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]

    def _user(self, request: Request, user_id: str) -> object:
        if not is_admin(request_user(request)):
            raise Forbidden("only staff see and set users' budgets")
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: user_id}).first()
        if user is None:
            raise NotFound(f"user {user_id!r} not found")
        return user

    def _body(self, user: object) -> UserBudgetOut:
        pk = int(user.pk)  # type: ignore[attr-defined]
        day = selectors.today()
        return user_budget_body(
            username=user.get_username(),  # type: ignore[attr-defined]
            own_nano=selectors.own_daily_budget_nano(user_id=pk),
            default_nano=selectors.default_daily_budget_nano(),
            raised_nano=selectors.raised_nano(user_id=pk, day=day),
            spent_nano=selectors.spent_nano(user_id=pk, day=day),
        )

    @extend_schema(
        operation_id="user_budget", responses={200: UserBudgetOut, **error_responses(401, 403, 404)}
    )
    def get(self, request: Request, user_id: str) -> Response:
        return Response(self._body(self._user(request, user_id)))

    @extend_schema(
        operation_id="user_budget_set",
        request=UserBudgetSerializer,
        responses={200: UserBudgetOut, **error_responses(400, 401, 403, 404)},
    )
    def put(self, request: Request, user_id: str) -> Response:
        user = self._user(request, user_id)
        serializer = UserBudgetSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        budgets.set_user_budget(
            user=user,  # type: ignore[arg-type]
            actor=request_user(request),
            daily_nano=serializer.validated_data["daily_usd"],
        )
        budget_updates.push_user_budgets(user_id=int(user.pk))  # type: ignore[attr-defined]
        return Response(self._body(user))
