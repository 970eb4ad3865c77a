from __future__ import annotations

from django.db.models import QuerySet

from sessions.models import Session

from .models import FileChange


def session_changes(*, session: Session, environment_id: str) -> QuerySet[FileChange]:
    """Most recently changed first (http-api.md, Workspace changes)."""
    return FileChange.objects.filter(session=session, environment_id=environment_id).order_by(
        "-changed_at", "-id"
    )
