"""Request validation of scheduled tasks (types only; the rule, zone and references are
checked by ``services``, which name the field in their 400)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from omnigent_site.strict_fields import StrictBooleanField, StrictCharField, StrictChoiceField
from sessions.serializers import StrictSerializer


class MoneyField(serializers.FloatField):
    """A JSON number (not a string, not a boolean) or null; the range is checked by the
    service."""

    default_error_messages = {"not_a_number": "must be a number or null"}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("not_a_number")
        return data


class ScheduledTaskCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=200)
    agent_id = StrictCharField(max_length=64)
    prompt = StrictCharField(max_length=100_000, trim_whitespace=False)
    rrule = StrictCharField(max_length=2000)
    timezone = StrictCharField(max_length=64)
    runner_id = StrictCharField(max_length=64, allow_null=True, allow_blank=True, required=False)
    enabled = StrictBooleanField(required=False)
    max_cost_usd = MoneyField(allow_null=True, required=False)
    session_mode = StrictChoiceField(choices=["new", "continue"], required=False)
    session_id = StrictCharField(max_length=64, allow_null=True, allow_blank=True, required=False)


class ScheduledTaskUpdateSerializer(ScheduledTaskCreateSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.required = False


class SchedulePreviewSerializer(StrictSerializer):
    rrule = StrictCharField(max_length=2000)
    timezone = StrictCharField(max_length=64)
