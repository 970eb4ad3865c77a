"""``WebhookEvent``: a fact to report to webhooks, written in the fact's own transaction."""

from __future__ import annotations

from django.db import models


class WebhookEvent(models.Model):
    """One event (automation.md, Body): ``{"id", "type", "created_at", "data"}``.

    Who may receive it is decided when it is delivered (``webhooks.fanout``): the readers
    of ``session_id`` at that time, the ``owner_id`` of a runner, the ``audience`` saved
    with a ``session.deleted`` (the readers just before the deletion), or the one
    ``webhook_id`` of a ``webhook.test``. ``dispatched`` turns true once the event has a
    delivery row for each webhook that receives it.
    """

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    type = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    data = models.JSONField(default=dict)
    # No foreign keys: the session or runner may be gone by delivery time.
    session_id = models.CharField(max_length=64, blank=True, default="")
    owner_id = models.BigIntegerField(null=True, blank=True)
    audience = models.JSONField(null=True, blank=True)
    webhook_id = models.CharField(max_length=64, blank=True, default="")
    dispatched = models.BooleanField(default=False)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="webhook_event_undispatched",
                condition=models.Q(dispatched=False),
            )
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"
