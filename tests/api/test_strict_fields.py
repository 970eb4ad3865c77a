"""The strict serializer fields (omnigent_site/strict_fields.py): JSON types, no coercion."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from omnigent_site.strict_fields import (
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
)


class Probe(serializers.Serializer):
    text = StrictCharField(required=False, allow_null=True, allow_blank=True)
    number = StrictIntegerField(required=False)
    flag = StrictBooleanField(required=False)
    level = StrictChoiceField(choices=[1, 2, 3], required=False)
    encoding = StrictChoiceField(choices=["utf-8", "base64"], required=False)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("text", "a"),
        ("text", ""),
        ("text", None),
        ("number", 0),
        ("number", -5),
        ("flag", False),
        ("level", 2),
        ("encoding", "base64"),
    ],
)
def test_values_of_the_right_type_pass(field: str, value: Any) -> None:
    probe = Probe(data={field: value})
    assert probe.is_valid(), probe.errors
    assert probe.validated_data[field] == (value.strip() if isinstance(value, str) else value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("text", 5),
        ("text", 1.5),
        ("text", True),
        ("text", ["a"]),
        ("text", {"a": "b"}),
        ("number", "3"),
        ("number", 3.0),
        ("number", True),
        ("number", None),
        ("flag", 1),
        ("flag", "true"),
        ("flag", "yes"),
        ("level", "2"),
        ("level", 2.0),
        ("level", True),
        ("encoding", 1),
        ("encoding", ["utf-8"]),
    ],
)
def test_values_of_another_type_are_refused_naming_the_field(field: str, value: Any) -> None:
    probe = Probe(data={field: value})
    assert not probe.is_valid()
    assert list(probe.errors) == [field]
