"""Writes of the webhook endpoints (automation.md, Webhooks): keyword-only, domain errors."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from omnigent_site.domain_errors import Conflict
from omnigent_site.ids import new_id
from webhook_outbox.events import enqueue_webhook_event

from . import ssrf
from .models import Delivery, Webhook
from .signing import new_secret

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

# The previous secret signs beside the new one this long after a rotation.
ROTATION_OVERLAP = timedelta(hours=24)
UNSET: Any = object()


def create_webhook(
    *, owner: AuthUser, url: str, events: list[str], description: str = ""
) -> Webhook:
    """A new webhook, enabled, with a fresh secret; a URL it may not call is a 400."""
    ssrf.check_url(url)
    return Webhook.objects.create(
        id=new_id("wh_"),
        owner=owner,
        url=url,
        events=events,
        description=description,
        secret=new_secret(),
    )


def update_webhook(
    *,
    webhook: Webhook,
    url: Any = UNSET,
    events: Any = UNSET,
    description: Any = UNSET,
    enabled: Any = UNSET,
) -> Webhook:
    """Change what was given. Enabling a webhook the server disabled clears the reason
    and the failure count; its pending deliveries resume."""
    fields = ["updated_at"]
    if url is not UNSET:
        ssrf.check_url(url)
        webhook.url = url
        fields.append("url")
    if events is not UNSET:
        webhook.events = events
        fields.append("events")
    if description is not UNSET:
        webhook.description = description
        fields.append("description")
    if enabled is not UNSET:
        webhook.enabled = enabled
        fields.append("enabled")
        if enabled:
            webhook.disabled_reason = ""
            webhook.consecutive_failures = 0
            fields += ["disabled_reason", "consecutive_failures"]
    webhook.save(update_fields=fields)
    return webhook


def delete_webhook(*, webhook: Webhook) -> None:
    """The webhook and its deliveries; an attempt in flight finishes unrecorded."""
    webhook.delete()


def rotate_secret(*, webhook: Webhook) -> str:
    """A new secret; the current one keeps signing beside it for 24 hours."""
    secret = new_secret()
    with transaction.atomic():
        locked = Webhook.objects.select_for_update().get(pk=webhook.pk)
        locked.previous_secret = locked.secret
        locked.previous_secret_expires_at = timezone.now() + ROTATION_OVERLAP
        locked.secret = secret
        locked.save(
            update_fields=["secret", "previous_secret", "previous_secret_expires_at", "updated_at"]
        )
    webhook.refresh_from_db()
    return secret


def send_test(*, webhook: Webhook) -> str:
    """Queue a ``webhook.test`` event for this webhook alone (whatever its filter);
    returns the event id."""
    with transaction.atomic():
        event = enqueue_webhook_event(
            type="webhook.test",
            data={"webhook_id": webhook.id, "message": "a test event from the server"},
            owner_id=webhook.owner_id,
            webhook_id=webhook.id,
        )
    return event.id


def redeliver(*, delivery: Delivery) -> Delivery:
    """One more attempt of this delivery, due now, with the same ``webhook-id``.

    A pending delivery is brought forward; a finished one (delivered or failed) gets
    one attempt beyond its schedule. An attempt in flight is a 409.
    """
    now = timezone.now()
    with transaction.atomic():
        row = Delivery.objects.select_for_update().get(pk=delivery.pk)
        if row.claimed_until is not None and row.claimed_until > now:
            raise Conflict("an attempt of this delivery is in flight; try again shortly")
        if row.status != Delivery.Status.PENDING:
            row.extra_attempts = F("extra_attempts") + 1
        row.status = Delivery.Status.PENDING
        row.next_attempt_at = now
        row.claimed_until = None
        row.save(
            update_fields=[
                "status",
                "next_attempt_at",
                "claimed_until",
                "extra_attempts",
                "updated_at",
            ]
        )
    transaction.on_commit(_wake)
    row.refresh_from_db()
    return row


def _wake() -> None:
    from .delivery import wake

    wake()
