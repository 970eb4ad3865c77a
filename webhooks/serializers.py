"""Input validation of the webhook endpoints; what they return is in ``shapes.py``."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from omnigent_site.json_input import UNSTORABLE_TEXT, has_unstorable_text
from omnigent_site.strict_fields import StrictBooleanField, StrictCharField
from sessions.serializers import StrictSerializer
from webhook_outbox.events import EVENT_TYPES


class EventTypesField(serializers.ListField):
    """A non-empty list of event types, or ``["*"]`` for all of them."""

    child = StrictCharField(max_length=64)

    def to_internal_value(self, data: Any) -> list[str]:
        value: list[str] = super().to_internal_value(data)
        if not value:
            raise serializers.ValidationError("name at least one event type, or '*'")
        unknown = [name for name in value if name != "*" and name not in EVENT_TYPES]
        if unknown:
            raise serializers.ValidationError(
                f"unknown event type {unknown[0]!r}; known: '*', {', '.join(EVENT_TYPES)}"
            )
        return ["*"] if "*" in value else list(dict.fromkeys(value))


class WebhookCreateSerializer(StrictSerializer):
    url = StrictCharField(max_length=2048)
    events = EventTypesField(max_length=len(EVENT_TYPES) + 1)
    description = StrictCharField(max_length=500, allow_blank=True, required=False, default="")

    def validate_description(self, value: str) -> str:
        if has_unstorable_text(value):
            raise serializers.ValidationError(UNSTORABLE_TEXT)
        return value


class WebhookUpdateSerializer(StrictSerializer):
    url = StrictCharField(max_length=2048, required=False)
    events = EventTypesField(max_length=len(EVENT_TYPES) + 1, required=False)
    description = StrictCharField(max_length=500, allow_blank=True, required=False)
    enabled = StrictBooleanField(required=False)

    def validate_description(self, value: str) -> str:
        if has_unstorable_text(value):
            raise serializers.ValidationError(UNSTORABLE_TEXT)
        return value
