"""Workspace change records, stored so the changes listing answers while a runner is offline."""

from __future__ import annotations

from django.db import models


class FileChange(models.Model):
    class Attribution(models.TextChoices):
        AGENT = "agent"
        USER = "user"

    class Status(models.TextChoices):
        CREATED = "created"
        MODIFIED = "modified"
        DELETED = "deleted"

    session = models.ForeignKey(
        "agent_sessions.Session", on_delete=models.CASCADE, related_name="file_changes"
    )
    environment_id = models.CharField(max_length=64, default="default")
    path = models.CharField(max_length=1024)
    name = models.CharField(max_length=1024)
    status = models.CharField(max_length=16, choices=Status.choices)
    bytes = models.BigIntegerField(null=True, blank=True)
    modified_at = models.BigIntegerField(null=True, blank=True)
    lines_added = models.IntegerField(null=True, blank=True)
    lines_removed = models.IntegerField(null=True, blank=True)
    before = models.TextField(null=True, blank=True)
    after = models.TextField(null=True, blank=True)
    changed_at = models.DateTimeField(auto_now=True)
    # Who made the path's latest change: the agent, or a person through the workspace
    # API (files.md §2). Recorded for the server's own use; not in the compat listing.
    attribution = models.CharField(
        max_length=16, choices=Attribution.choices, default=Attribution.AGENT
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "environment_id", "path"], name="unique_change_path"
            )
        ]
        indexes = [
            models.Index(fields=["session", "environment_id", "-changed_at"], name="change_recent")
        ]

    def __str__(self) -> str:
        return f"{self.path} ({self.status})"
