"""The JSON shapes of the changes and diff endpoints (http-api.md, Workspace changes).

Typed dicts rendered by plain functions and documented from the same classes
(``omnigent_site/schema.py``); see ``sessions/shapes.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import ObjectList

from .models import FileChange


class ChangeEntryOut(TypedDict):
    """One changed path of the workspace, relative to its root."""

    object: Literal["session.environment.filesystem.entry"]
    path: str
    name: str
    status: Annotated[str, FileChange.Status]
    bytes: int | None
    modified_at: Annotated[int | None, Doc("Unix seconds")]
    lines_added: int | None
    lines_removed: int | None


def change_body(change: FileChange) -> ChangeEntryOut:
    return {
        "object": "session.environment.filesystem.entry",
        "path": change.path,
        "name": change.name,
        "status": change.status,
        "bytes": change.bytes,
        "modified_at": change.modified_at,
        "lines_added": change.lines_added,
        "lines_removed": change.lines_removed,
    }


class ChangeList(ObjectList[ChangeEntryOut]):
    """The session's change set, most recently changed first; never paginated."""

    has_more: Annotated[bool, Doc("always false")]


def change_list_body(changes: Iterable[FileChange]) -> ChangeList:
    return {"object": "list", "has_more": False, "data": [change_body(c) for c in changes]}


class FileDiffOut(TypedDict):
    """A changed file's content before and after (null: it did not exist)."""

    object: Literal["session.environment.filesystem.file_diff"]
    path: str
    before: str | None
    after: str | None


def file_diff_body(change: FileChange) -> FileDiffOut:
    return {
        "object": "session.environment.filesystem.file_diff",
        "path": change.path,
        "before": change.before,
        "after": change.after,
    }
