"""Serializer fields that check JSON types instead of coercing them (http-api.md, Input
strictness).

DRF's fields are lenient by design: ``CharField`` turns ``5`` into ``"5"``,
``IntegerField`` takes ``"3"`` and ``3.0``, ``BooleanField`` takes ``"yes"`` and ``1``, and
``ChoiceField`` compares ``str(value)``. A client that sends the wrong type has a bug the
API should name, so every field in a request serializer of this project comes from
here: the value must already have the JSON type the field documents, else 400
``invalid_input`` with the field named in ``fields``. ``null`` and missing values keep
DRF's handling (``allow_null``, ``required``). DRF's ``DictField``, ``ListField`` and
``FileField`` already refuse other types and are used as they are (with strict children).
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A JSON string, never a number or a boolean turned into one."""

    default_error_messages = {"not_a_string": "must be a string"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        value: str = super().to_internal_value(data)
        return value


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: not a boolean, not a float, not a numeric string."""

    default_error_messages = {"not_an_integer": "must be an integer"}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_an_integer")
        value: int = super().to_internal_value(data)
        return value


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false``, not ``1``, ``"yes"`` or ``"true"``."""

    default_error_messages = {"not_a_boolean": "must be true or false"}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("not_a_boolean")
        return data


class StrictChoiceField(serializers.ChoiceField):
    """One of the choices, of the choice's own type (``1`` is not ``"1"``)."""

    def to_internal_value(self, data: Any) -> Any:
        for choice in self.choices:
            if type(choice) is type(data) and choice == data:
                return choice
        self.fail("invalid_choice", input=_shown(data))


def _shown(value: Any) -> str:
    """A refused value as the error message shows it: short, and always renderable."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
