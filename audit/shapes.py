"""The audit record as ``GET /v1/audit`` renders it (lifecycle.md, Audit log)."""

from __future__ import annotations

from typing import Annotated, Any

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import CursorPage
from omnigent_site.timeutil import unix

from .models import AuditRecord


class AuditRecordOut(TypedDict):
    """One act: who did what to what, and when."""

    id: Annotated[str, Doc("`aud_<n>`: increases with every record")]
    at: Annotated[int, Doc("Unix seconds")]
    actor: Annotated[str | None, Doc("the user's name; null for the server itself")]
    action: str
    target_type: str
    target_id: str
    session_id: str | None
    details: dict[str, Any]


class AuditPage(CursorPage[AuditRecordOut]):
    """One page of the audit log."""


def audit_record(record: AuditRecord) -> AuditRecordOut:
    return {
        "id": record.public_id,
        "at": unix(record.at) or 0,
        "actor": record.actor,
        "action": record.action,
        "target_type": record.target_type,
        "target_id": record.target_id,
        "session_id": record.session_id,
        "details": record.details,
    }
