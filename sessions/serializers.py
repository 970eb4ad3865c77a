"""Input validation (DRF serializers) of the sessions app's endpoints (http-api.md).

What the endpoints return is in ``shapes.py``: typed dicts rendered by plain functions
and documented from the same classes (docs/architecture.md, one definition per shape).
"""

from __future__ import annotations

import math
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from omnigent_runner.policies import MAX_BUDGET_USD, usd_as_nano
from omnigent_site.json_input import (
    UNSTORABLE_TEXT,
    JsonTextError,
    has_unstorable_text,
    loads_json,
)
from omnigent_site.strict_fields import StrictBooleanField, StrictCharField, StrictIntegerField

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,256}")


class StrictSerializer(serializers.Serializer):
    """Unknown keys are a 400, not silently dropped (http-api.md: fail loud)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["unknown field"] for key in unknown})
        return super().to_internal_value(data)


class LabelsField(serializers.DictField):
    child = StrictCharField(max_length=1024, allow_blank=True)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value = super().to_internal_value(data)
        if len(value) > 64:
            raise serializers.ValidationError("at most 64 labels")
        for key in value:
            if not key or len(key) > 128:
                raise serializers.ValidationError("label keys are 1 to 128 characters")
        if has_unstorable_text(value):
            raise serializers.ValidationError(UNSTORABLE_TEXT)
        return value


class SessionMetadataSerializer(StrictSerializer):
    """The ``metadata`` part of a multipart create."""

    title = StrictCharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)


class SessionCreateSerializer(StrictSerializer):
    agent_id = StrictCharField(max_length=64)
    title = StrictCharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)
    initial_items = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=1000
    )


@extend_schema_field({"type": "number", "minimum": 0, "maximum": MAX_BUDGET_USD, "nullable": True})
class BudgetUsdField(serializers.Field):
    """A budget in US dollars: a JSON number from 0 to ``MAX_BUDGET_USD`` (a string or
    a boolean is a 400, not coerced), validated as whole nano-dollars."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise serializers.ValidationError("must be a number of US dollars or null")
        if not math.isfinite(data) or not 0 <= data <= MAX_BUDGET_USD:
            raise serializers.ValidationError(f"must be from 0 to {MAX_BUDGET_USD:,} dollars")
        return usd_as_nano(data)

    def to_representation(self, value: Any) -> Any:
        return value


class SessionUpdateSerializer(StrictSerializer):
    runner_id = StrictCharField(max_length=64, allow_blank=True, allow_null=True, required=False)
    title = StrictCharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)
    share_workspace_files = StrictBooleanField(required=False)
    archived = StrictBooleanField(required=False)
    # Nano-dollars once validated; null removes the session's own budget (usage.md).
    budget_usd = BudgetUsdField(required=False, allow_null=True)


class PermissionGrantSerializer(StrictSerializer):
    user_id = StrictCharField(max_length=150)
    level = StrictIntegerField()

    def validate_level(self, value: int) -> int:
        if not 1 <= value <= 3:
            raise serializers.ValidationError("must be 1 (read), 2 (edit) or 3 (manage)")
        return value


CLIENT_TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,256}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object", "additionalProperties": True},
            },
            "required": ["name"],
        },
    },
    "required": ["type", "function"],
}


@extend_schema_field(CLIENT_TOOL_SCHEMA)
class ClientToolField(serializers.Field):
    """A client-side function tool in OpenAI's format.

    A field rather than a nested serializer: every ``POST .../events`` builds the
    event serializer, and DRF deep-copies a nested serializer each time.
    """

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or data.get("type") != "function":
            raise serializers.ValidationError(
                'a tool must be {"type": "function", "function": {...}}'
            )
        if has_unstorable_text(data):
            raise serializers.ValidationError(UNSTORABLE_TEXT)
        function = data.get("function")
        if not isinstance(function, dict):
            raise serializers.ValidationError("a tool needs a 'function' object")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise serializers.ValidationError(
                "a tool's function name must match [A-Za-z0-9_-]{1,256}"
            )
        description = function.get("description", "")
        if not isinstance(description, str):
            raise serializers.ValidationError("a tool's description must be a string")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise serializers.ValidationError("a tool's parameters must be a JSON schema object")
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }

    def to_representation(self, instance: Any) -> Any:
        return instance


class EventSerializer(serializers.Serializer):
    type = StrictCharField(max_length=64)
    # DRF's metaclass moves declared fields off the class, so ``.data`` stays the property.
    data = serializers.DictField(required=False, default=dict)  # type: ignore[assignment]
    tools = serializers.ListField(child=ClientToolField(), required=False, max_length=128)


class FunctionCallOutputSerializer(serializers.Serializer):
    call_id = StrictCharField(max_length=256)
    output = StrictCharField(allow_blank=True, trim_whitespace=False)


def parse_metadata_part(raw: Any) -> dict[str, Any]:
    """The multipart ``metadata`` part is a JSON string."""
    if raw in (None, ""):
        return {}
    if hasattr(raw, "read"):
        raw = raw.read()
    if not isinstance(raw, str | bytes):
        raise serializers.ValidationError({"metadata": ["must be a JSON text"]})
    try:
        value = loads_json(raw)
    except JsonTextError as exc:
        raise serializers.ValidationError({"metadata": [str(exc)]}) from None
    if not isinstance(value, dict):
        raise serializers.ValidationError({"metadata": ["must be a JSON object"]})
    serializer = SessionMetadataSerializer(data=value)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class BundleUploadForm(serializers.Serializer):
    """The browsable API's form for ``POST /v1/agents`` (multipart, a bundle file)."""

    bundle = serializers.FileField(help_text="agent bundle: a .tar.gz with agent.yaml")


class SessionUploadForm(BundleUploadForm):
    """The browsable API's form for ``POST /v1/sessions`` (multipart create)."""

    metadata = StrictCharField(
        required=False,
        help_text='optional JSON: {"title": …, "labels": {…}}',
        style={"base_template": "textarea.html", "rows": 3},
    )


class ElicitationResolveSerializer(serializers.Serializer):
    """``POST .../elicitations/{eid}/resolve``. ``action`` is checked by the service,
    after the elicitation's session was authorised (approvals.md: 400 before 404)."""

    action = StrictCharField(max_length=32, help_text="accept, decline or cancel")
    content = serializers.DictField(
        required=False,
        allow_null=True,
        help_text="form content: an MCP server's question checks it against its schema "
        "(a mismatch is a decline); ignored for a rule's question",
    )
    reason = StrictCharField(
        max_length=2000, required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )

    # Strings, not coerced (http-api.md, Input strictness): ``"action": 1`` is a 400.
    string_fields: tuple[str, ...] = ("action", "reason")

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            for name in self.string_fields:
                value = data.get(name)
                if value is not None and not isinstance(value, str):
                    raise serializers.ValidationError({name: ["must be a string"]})
            if has_unstorable_text(data.get("reason")):
                raise serializers.ValidationError({"reason": [UNSTORABLE_TEXT]})
        return super().to_internal_value(data)


class ApprovalEventSerializer(ElicitationResolveSerializer):
    """``data`` of ``POST .../events {"type": "approval"}``."""

    elicitation_id = StrictCharField(max_length=64)
    string_fields = ("action", "reason", "elicitation_id")


class PolicyUpdateSerializer(serializers.Serializer):
    """``PUT .../policies``: documents the body. The rules themselves are validated by
    ``omnigent_runner.policies`` (``sessions.policies.replace_session_rules``), which
    names each problem as ``rules.<index>.<field>``."""

    rules = serializers.ListField(
        child=serializers.DictField(),
        help_text='the session\'s own rules: [{"name", "tools", "when"?, "action", '
        '"reason"?, "ask_timeout"?}]',
    )


class ForkSerializer(serializers.Serializer):
    """``POST /v1/sessions/{id}/fork`` (files.md §3); other keys are ignored."""

    title = StrictCharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    up_to_response_id = StrictCharField(max_length=64, allow_null=True, required=False)

    def validate_title(self, value: str | None) -> str | None:
        if value is not None and has_unstorable_text(value):
            raise serializers.ValidationError(UNSTORABLE_TEXT)
        return value


class UserBudgetSerializer(StrictSerializer):
    """``PUT /v1/users/{id}/budget``: the user's own daily budget; null removes it."""

    daily_usd = BudgetUsdField(allow_null=True)
