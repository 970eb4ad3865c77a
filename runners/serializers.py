"""Input validation of the runner endpoints; what they return is in ``shapes.py``."""

from __future__ import annotations

from omnigent_site.strict_fields import StrictCharField
from sessions.serializers import StrictSerializer


class RunnerCreateSerializer(StrictSerializer):
    name = StrictCharField(max_length=128, allow_blank=True, required=False, default="")
