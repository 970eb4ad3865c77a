"""Webhooks, their deliveries (one per event and webhook) and each delivery's attempts."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Webhook(models.Model):
    id = models.CharField(primary_key=True, max_length=64, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks"
    )
    url = models.URLField(max_length=2048)
    events = models.JSONField(default=list)
    description = models.CharField(max_length=500, blank=True, default="")
    enabled = models.BooleanField(default=True)
    # Why the server disabled it (410 Gone, too many failed events); "" otherwise.
    disabled_reason = models.CharField(max_length=500, blank=True, default="")
    # ``whsec_<base64>``: signs every delivery. After a rotation the previous secret
    # signs beside it until ``previous_secret_expires_at`` (automation.md: 24 h).
    secret = models.CharField(max_length=128)
    previous_secret = models.CharField(max_length=128, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # Events in a row that ended ``failed``; reset by a delivered one.
    consecutive_failures = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["owner", "created_at"], name="webhook_owner_created")]

    def __str__(self) -> str:
        return f"{self.id} {self.url}"

    def receives(self, event_type: str) -> bool:
        return event_type == "webhook.test" or "*" in self.events or event_type in self.events


class Delivery(models.Model):
    """An event for one webhook: ``pending`` until a 2xx (``delivered``) or until the
    retries run out (``failed``). ``next_attempt_at`` is when it is due; while an
    attempt is in flight it holds the claim's expiry, so a process killed mid-delivery
    leaves the row due again (``webhooks.delivery``)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(
        "webhook_outbox.WebhookEvent", on_delete=models.CASCADE, related_name="deliveries"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while an attempt is in flight; cleared with its result.
    claimed_until = models.DateTimeField(null=True, blank=True)
    # Attempts left past the retry schedule (a redelivery of a finished row adds one).
    extra_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["event", "webhook"], name="delivery_once_per_webhook")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_due",
                condition=models.Q(status="pending"),
            ),
            models.Index(fields=["webhook", "created_at"], name="delivery_webhook_created"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class DeliveryAttempt(models.Model):
    """One HTTP request of a delivery (the deliveries log's detail; the admin shows it)."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="delivery_attempt_once")
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}"
