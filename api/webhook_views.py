"""Webhook endpoints (automation.md, Webhooks): the caller's own webhooks only.

Another user's webhook answers 404 like a missing one. Views parse, look up through
``webhooks.selectors`` and call ``webhooks.services``; sending is the delivery worker's
part (``webhooks.delivery``), so ``test`` and ``redeliver`` answer 202 at once.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from omnigent_site.authentication import request_user
from omnigent_site.pagination import paginate, parse_list_params
from omnigent_site.schema import error_responses, list_parameters
from webhooks import selectors, services
from webhooks.serializers import WebhookCreateSerializer, WebhookUpdateSerializer
from webhooks.shapes import (
    DeliveryPage,
    DeliveryQueuedOut,
    SecretOut,
    TestQueuedOut,
    WebhookCreatedOut,
    WebhookDeletedOut,
    WebhookList,
    WebhookOut,
    delivery_body,
    delivery_queued_body,
    test_queued_body,
    webhook_body,
    webhook_created_body,
    webhook_deleted_body,
    webhook_list_body,
)


class WebhookListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="webhooks_list", responses={200: WebhookList, **error_responses(401)}
    )
    def get(self, request: Request) -> Response:
        webhooks = list(selectors.webhooks_of(user=request_user(request)))
        return Response(webhook_list_body(webhooks))

    @extend_schema(
        request=WebhookCreateSerializer,
        responses={201: WebhookCreatedOut, **error_responses(400, 401, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        serializer = WebhookCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        webhook = services.create_webhook(owner=request_user(request), **serializer.validated_data)
        return Response(webhook_created_body(webhook), status=status.HTTP_201_CREATED)


class WebhookDetailView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: WebhookOut, **error_responses(401, 404)})
    def get(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        return Response(webhook_body(webhook))

    @extend_schema(
        request=WebhookUpdateSerializer,
        responses={200: WebhookOut, **error_responses(400, 401, 404, 415)},
    )
    def patch(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        serializer = WebhookUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        webhook = services.update_webhook(webhook=webhook, **serializer.validated_data)
        return Response(webhook_body(webhook))

    @extend_schema(responses={200: WebhookDeletedOut, **error_responses(401, 404)})
    def delete(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        services.delete_webhook(webhook=webhook)
        return Response(webhook_deleted_body(webhook_id))


class WebhookRotateSecretView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={200: SecretOut, **error_responses(401, 404)})
    def post(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        return Response({"secret": services.rotate_secret(webhook=webhook)})


class WebhookTestView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={202: TestQueuedOut, **error_responses(401, 404)})
    def post(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        event_id = services.send_test(webhook=webhook)
        return Response(test_queued_body(event_id), status=status.HTTP_202_ACCEPTED)


class DeliveryListView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="webhooks_deliveries_list",
        parameters=list_parameters(default_limit=20, default_order="desc"),
        responses={200: DeliveryPage, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, webhook_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        params = parse_list_params(request.query_params, default_order="desc")
        page = paginate(selectors.deliveries_of(webhook=webhook), params, sort_field="created_at")
        return Response(page.body(delivery_body, lambda delivery: delivery.id))


class DeliveryRedeliverView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=None, responses={202: DeliveryQueuedOut, **error_responses(401, 404, 409)}
    )
    def post(self, request: Request, webhook_id: str, delivery_id: str) -> Response:
        webhook = selectors.webhook_for(user=request_user(request), webhook_id=webhook_id)
        delivery = selectors.delivery_for(webhook=webhook, delivery_id=delivery_id)
        services.redeliver(delivery=delivery)
        return Response(delivery_queued_body(delivery.id), status=status.HTTP_202_ACCEPTED)
