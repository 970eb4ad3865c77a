"""Input validation of the runner endpoints; what they return is in ``shapes.py``."""

from __future__ import annotations

from rest_framework import serializers

from sessions.serializers import StrictSerializer


class RunnerCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=128, allow_blank=True, required=False, default="")
