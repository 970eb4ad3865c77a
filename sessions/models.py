"""Agents, sessions, their transcript (items), turns (responses), grants and event log.

Models hold data and invariants only; every write goes through ``services.py``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from omnigent_site.ids import new_agent_id, new_response_id, new_session_id
from omnigent_site.timeutil import unix


class Agent(models.Model):
    """A validated bundle. Templates are shared by name; session agents are private copies."""

    class Kind(models.TextChoices):
        TEMPLATE = "template"
        SESSION = "session"

    id = models.CharField(primary_key=True, max_length=64, default=new_agent_id, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=128)
    description = models.TextField(blank=True, default="")
    model = models.CharField(max_length=256, blank=True, default="")
    # The parsed spec without secrets (``AgentSpec.public_dict()``).
    spec = models.JSONField(default=dict)
    bundle_sha256 = models.CharField(max_length=64)
    bundle_size = models.PositiveBigIntegerField()
    version = models.PositiveIntegerField(default=1)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Deleting a template hides it; sessions created from it keep working.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(kind="template", deleted_at__isnull=True),
                name="unique_template_agent_name",
            )
        ]
        indexes = [
            models.Index(fields=["kind", "created_at"], name="agent_kind_created"),
            models.Index(fields=["bundle_sha256"], name="agent_bundle"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class Session(models.Model):
    class Status(models.TextChoices):
        IDLE = "idle"
        RUNNING = "running"
        WAITING = "waiting"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=512, null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IDLE)
    last_task_error = models.JSONField(null=True, blank=True)
    active_response_id = models.CharField(max_length=64, null=True, blank=True)
    runner = models.ForeignKey(
        "runners.Runner",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sessions",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Highest runner event ``seq`` stored (tunnel.md: cumulative ``event.ack``).
    last_runner_seq = models.BigIntegerField(default=0)
    # Highest sequence number in this session's event log (the stream's ``id:``).
    last_event_seq = models.BigIntegerField(default=0)
    # The runner connection generation that acknowledged ``session.open`` (0: none).
    runner_generation_opened = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["created_at", "id"], name="session_created"),
            models.Index(fields=["updated_at", "id"], name="session_updated"),
            models.Index(fields=["runner", "status"], name="session_runner_status"),
        ]

    def __str__(self) -> str:
        return self.id


class Turn(models.Model):
    """One turn: the runner's answer to one user message."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    OPEN_STATUSES = (Status.QUEUED, Status.IN_PROGRESS)

    id = models.CharField(primary_key=True, max_length=64, default=new_response_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.JSONField(null=True, blank=True)
    # Client-side tools sent with the message, kept so the turn can be re-sent.
    tools = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["session", "created_at"], name="turn_session_created"),
            models.Index(fields=["session", "status"], name="turn_session_status"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES


class Item(models.Model):
    """One transcript entry. ``data`` holds the type-specific fields (the flat shape's rest)."""

    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=128, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="items")
    response = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="items"
    )
    type = models.CharField(max_length=64)
    status = models.CharField(max_length=32, default="completed")
    data = models.JSONField(default=dict)
    created_by = models.CharField(max_length=254, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "id"], name="unique_item_per_session")
        ]
        indexes = [models.Index(fields=["session", "seq"], name="item_session_seq")]

    def __str__(self) -> str:
        return self.id

    def header(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "status": self.status,
            "response_id": self.response_id,
            "created_at": unix(self.created_at),
            "created_by": self.created_by,
        }

    def flat(self) -> dict[str, Any]:
        """The flat shape of ``/items`` and the stream: type fields at the top level."""
        return {**self.data, **self.header()}

    def nested(self) -> dict[str, Any]:
        """The nested shape of the session snapshot: type fields under ``data``."""
        return {**self.header(), "data": self.data}


class Permission(models.Model):
    class Level(models.IntegerChoices):
        READ = 1
        EDIT = 2
        MANAGE = 3
        OWNER = 4

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="session_grants"
    )
    level = models.PositiveSmallIntegerField(choices=Level.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "user"], name="unique_grant"),
            models.UniqueConstraint(
                fields=["session"], condition=Q(level=4), name="one_owner_per_session"
            ),
            models.CheckConstraint(
                condition=Q(level__gte=1) & Q(level__lte=4), name="grant_level_range"
            ),
        ]
        indexes = [models.Index(fields=["user", "session"], name="grant_user_session")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.session_id}={self.level}"


class SessionEvent(models.Model):
    """The session's durable event log: what the stream replays on resume."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="unique_event_seq")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.type}"
