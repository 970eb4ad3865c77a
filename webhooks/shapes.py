"""The JSON shapes of the webhook endpoints and of the events they send (automation.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import CursorPage, ObjectList
from omnigent_site.timeutil import unix
from webhook_outbox.models import WebhookEvent

from .models import Delivery, Webhook

OptionalUnixTime = Annotated[int | None, Doc("Unix seconds")]


class WebhookOut(TypedDict):
    """A webhook; the secret is never shown here (only when created or rotated)."""

    id: str
    object: Literal["webhook"]
    url: str
    events: Annotated[list[str], Doc("event types, or ['*'] for all")]
    description: str
    enabled: bool
    disabled_reason: Annotated[
        str | None, Doc("why the server disabled it (410 Gone, 20 failed events in a row)")
    ]
    created_at: int
    updated_at: int


class WebhookCreatedOut(WebhookOut):
    secret: Annotated[str, Doc("whsec_…: shown this once")]


def webhook_body(webhook: Webhook) -> WebhookOut:
    return {
        "id": webhook.id,
        "object": "webhook",
        "url": webhook.url,
        "events": list(webhook.events),
        "description": webhook.description,
        "enabled": webhook.enabled,
        "disabled_reason": webhook.disabled_reason or None,
        "created_at": int(webhook.created_at.timestamp()),
        "updated_at": int(webhook.updated_at.timestamp()),
    }


def webhook_created_body(webhook: Webhook) -> WebhookCreatedOut:
    return {**webhook_body(webhook), "secret": webhook.secret}


class WebhookList(ObjectList[WebhookOut]):
    """The caller's webhooks, oldest first; not paginated."""


def webhook_list_body(webhooks: list[Webhook]) -> WebhookList:
    return {"object": "list", "data": [webhook_body(webhook) for webhook in webhooks]}


class WebhookDeletedOut(TypedDict):
    id: str
    object: Literal["webhook.deleted"]
    deleted: bool


def webhook_deleted_body(webhook_id: str) -> WebhookDeletedOut:
    return {"id": webhook_id, "object": "webhook.deleted", "deleted": True}


class SecretOut(TypedDict):
    secret: Annotated[str, Doc("the new whsec_… secret, shown this once")]


class DeliveryOut(TypedDict):
    """One event for one webhook, with its latest attempt."""

    id: str
    object: Literal["webhook.delivery"]
    event_id: Annotated[str, Doc("also the webhook-id header of every attempt")]
    type: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    latency_ms: int | None
    next_attempt_at: OptionalUnixTime
    created_at: int


def delivery_body(delivery: Delivery) -> DeliveryOut:
    pending = delivery.status == Delivery.Status.PENDING
    return {
        "id": delivery.id,
        "object": "webhook.delivery",
        "event_id": delivery.event_id,
        "type": delivery.event.type,
        "status": delivery.status,  # type: ignore[typeddict-item]
        "attempts": delivery.attempts,
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error or None,
        "latency_ms": delivery.latency_ms,
        "next_attempt_at": unix(delivery.next_attempt_at) if pending else None,
        "created_at": int(delivery.created_at.timestamp()),
    }


class DeliveryPage(CursorPage[DeliveryOut]):
    """A webhook's deliveries, newest first."""


class DeliveryQueuedOut(TypedDict):
    """202: the attempt is queued (its result shows in the deliveries list)."""

    id: str
    status: Literal["pending"]


def delivery_queued_body(delivery_id: str) -> DeliveryQueuedOut:
    return {"id": delivery_id, "status": "pending"}


class TestQueuedOut(TypedDict):
    """202: a ``webhook.test`` event is queued for this webhook."""

    event_id: str
    queued: bool


def test_queued_body(event_id: str) -> TestQueuedOut:
    return {"event_id": event_id, "queued": True}


class EventBody(TypedDict):
    """What a receiver gets (automation.md, Body)."""

    id: str
    type: str
    created_at: int
    data: dict[str, Any]


def event_body(event: WebhookEvent) -> EventBody:
    return {
        "id": event.id,
        "type": event.type,
        "created_at": int(event.created_at.timestamp()),
        "data": event.data,
    }
