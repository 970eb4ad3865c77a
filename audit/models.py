"""The audit log: one row per security-relevant act (lifecycle.md, Audit log).

Rows are only ever inserted (``audit.services.record``). The model refuses to save a
row twice or to delete one; its manager refuses bulk updates and deletes; a database
trigger refuses ``UPDATE`` (and on PostgreSQL ``DELETE``) whatever the caller. The one
way out is the retention of audit records (``audit.services.purge_older_than``), which
opens a permit (``AuditPurgePermit``) in its own transaction.

Nothing here is a foreign key: a record outlives the user, session or runner it names.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models


class AuditImmutable(Exception):
    """Something tried to change or delete an audit record."""


class AuditQuerySet(models.QuerySet["AuditRecord"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AuditImmutable("audit records cannot be changed")

    def delete(self) -> NoReturn:  # type: ignore[override]
        raise AuditImmutable("audit records are deleted only by their retention")


class AuditRecord(models.Model):
    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField()
    # The user's name (a record outlives the user); null: the server itself (a sweep).
    actor = models.CharField(max_length=254, null=True, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=256)
    session_id = models.CharField(max_length=64, null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["at", "id"], name="audit_at"),
            models.Index(fields=["actor", "id"], name="audit_actor"),
            models.Index(fields=["session_id", "id"], name="audit_session"),
            models.Index(fields=["action", "id"], name="audit_action"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.action} {self.target_type}:{self.target_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AuditImmutable("audit records cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AuditImmutable("audit records are deleted only by their retention")

    @property
    def public_id(self) -> str:
        return f"aud_{self.pk}"


class AuditPurgePermit(models.Model):
    """Present only inside the retention's own transaction: records older than
    ``cutoff`` may be deleted then (the PostgreSQL trigger checks it)."""

    cutoff = models.DateTimeField()

    def __str__(self) -> str:
        return f"purge before {self.cutoff}"
