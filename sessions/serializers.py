"""Input validation (DRF serializers) and the JSON shapes of http-api.md."""

from __future__ import annotations

import json
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from omnigent_site.json_input import UNSTORABLE_TEXT, has_unstorable_text
from omnigent_site.timeutil import unix

from .models import Agent, Item, Permission, Session, Turn

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
    child = serializers.CharField(max_length=1024, allow_blank=True)

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

    title = serializers.CharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)


class SessionCreateSerializer(StrictSerializer):
    agent_id = serializers.CharField(max_length=64)
    title = serializers.CharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)
    initial_items = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=1000
    )


class SessionUpdateSerializer(StrictSerializer):
    runner_id = serializers.CharField(
        max_length=64, allow_blank=True, allow_null=True, required=False
    )
    title = serializers.CharField(max_length=512, allow_null=True, allow_blank=True, required=False)
    labels = LabelsField(required=False)


class PermissionGrantSerializer(StrictSerializer):
    user_id = serializers.CharField(max_length=150)
    level = serializers.IntegerField()

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
    type = serializers.CharField(max_length=64)
    # DRF's metaclass moves declared fields off the class, so ``.data`` stays the property.
    data = serializers.DictField(required=False, default=dict)  # type: ignore[assignment]
    tools = serializers.ListField(child=ClientToolField(), required=False, max_length=128)


class FunctionCallOutputSerializer(serializers.Serializer):
    call_id = serializers.CharField(max_length=256)
    output = serializers.CharField(allow_blank=True, trim_whitespace=False)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("output"), str) and "output" in data:
            raise serializers.ValidationError({"output": ["must be a string"]})
        return super().to_internal_value(data)


def parse_metadata_part(raw: Any) -> dict[str, Any]:
    """The multipart ``metadata`` part is a JSON string."""
    if raw in (None, ""):
        return {}
    if hasattr(raw, "read"):
        raw = raw.read()
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise serializers.ValidationError({"metadata": [f"not valid JSON: {exc}"]}) from exc
    if not isinstance(value, dict):
        raise serializers.ValidationError({"metadata": ["must be a JSON object"]})
    serializer = SessionMetadataSerializer(data=value)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# --- output shapes ----------------------------------------------------------------


def agent_body(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "object": "agent",
        "name": agent.name,
        "description": agent.description,
        "created_at": unix(agent.created_at),
        "model": agent.model or None,
        "version": agent.version,
    }


def session_body(
    session: Session, *, level: int, items: list[Item] | None = None
) -> dict[str, Any]:
    runner = session.runner
    body = {
        "id": session.id,
        "object": "session",
        "agent_id": session.agent_id,
        "agent_name": session.agent.name,
        "status": session.status,
        "created_at": unix(session.created_at),
        "updated_at": unix(session.updated_at),
        "title": session.title,
        "labels": session.labels or {},
        "runner_id": session.runner_id,
        "runner_online": runner.online if runner is not None else True,
        "last_task_error": session.last_task_error,
        "active_response_id": session.active_response_id,
        "permission_level": level,
    }
    if items is not None:
        body["items"] = [item.nested() for item in items]
    return body


def response_body(response: Turn, *, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": response.id,
        "object": "response",
        "status": response.status,
        "error": response.error,
        "output": output,
        "created_at": unix(response.created_at),
        "completed_at": unix(response.completed_at),
    }


def grant_body(grant: Permission) -> dict[str, Any]:
    return {
        "user_id": grant.user.get_username(),
        "conversation_id": grant.session_id,
        "level": grant.level,
    }


# --- schema-only serializers (drf-spectacular documents the shapes above) ---------


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


class AgentOutSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.IntegerField()
    model = serializers.CharField(allow_null=True)
    version = serializers.IntegerField()


class ItemOutSerializer(serializers.Serializer):
    id = serializers.CharField()
    type = serializers.CharField()
    status = serializers.CharField()
    response_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField()
    created_by = serializers.CharField(allow_null=True)
    # DRF's metaclass moves declared fields off the class, so ``.data`` stays the property.
    data = serializers.DictField()  # type: ignore[assignment]


class SessionOutSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    agent_id = serializers.CharField()
    agent_name = serializers.CharField()
    status = serializers.ChoiceField(choices=Session.Status.choices)
    created_at = serializers.IntegerField()
    updated_at = serializers.IntegerField()
    title = serializers.CharField(allow_null=True)
    labels = serializers.DictField(child=serializers.CharField())
    runner_id = serializers.CharField(allow_null=True)
    runner_online = serializers.BooleanField()
    last_task_error = ErrorDetailSerializer(allow_null=True)
    active_response_id = serializers.CharField(allow_null=True)
    permission_level = serializers.IntegerField()
    items = ItemOutSerializer(many=True)


class ResponseOutSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    status = serializers.ChoiceField(choices=Turn.Status.choices)
    error = ErrorDetailSerializer(allow_null=True)
    output = serializers.ListField(child=serializers.DictField())
    created_at = serializers.IntegerField()
    completed_at = serializers.IntegerField(allow_null=True)


class GrantOutSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    conversation_id = serializers.CharField()
    session_id = serializers.CharField()
    level = serializers.IntegerField()


class SessionCreatedSerializer(serializers.Serializer):
    session_id = serializers.CharField()
    agent_id = serializers.CharField()
    agent_name = serializers.CharField()


class DeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField()
    deleted = serializers.BooleanField()
