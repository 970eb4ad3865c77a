"""Reads that decide which webhooks and deliveries a user may see (automation.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnigent_site.domain_errors import NotFound

from .models import Delivery, Webhook

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
    from django.db.models import QuerySet


def webhooks_of(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Webhook]:
    """A user's own webhooks (an admin sees all of them in the Django admin only)."""
    return Webhook.objects.filter(owner_id=user.pk)


def webhook_for(*, user: AbstractBaseUser | AnonymousUser, webhook_id: str) -> Webhook:
    """The caller's webhook; another user's answers like a missing one (404)."""
    webhook = webhooks_of(user=user).filter(pk=webhook_id).first()
    if webhook is None:
        raise NotFound(f"webhook {webhook_id!r} not found")
    return webhook


def deliveries_of(*, webhook: Webhook) -> QuerySet[Delivery]:
    return Delivery.objects.filter(webhook=webhook).select_related("event")


def delivery_for(*, webhook: Webhook, delivery_id: str) -> Delivery:
    delivery = deliveries_of(webhook=webhook).filter(pk=delivery_id).first()
    if delivery is None:
        raise NotFound(f"delivery {delivery_id!r} not found")
    return delivery
