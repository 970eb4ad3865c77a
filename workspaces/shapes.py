"""The JSON shapes of the changes and diff endpoints (http-api.md, Workspace changes).

Typed dicts rendered by plain functions and documented from the same classes
(``omnigent_site/schema.py``); see ``sessions/shapes.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

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


# --- the workspace through the server (files.md §2) ---------------------------------------
#
# The runner answers ``workspace.*`` rpc with plain JSON; these functions take only the
# documented keys, each checked for its type, so a runner's extra or malformed fields never
# reach a client. A malformed answer raises ``ValueError`` (the relay's 503).


def _str(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise ValueError(f"the runner's answer has no string {key!r}")
    return value


def _int(raw: Mapping[str, Any], key: str, *, nullable: bool = False) -> Any:
    value = raw.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"the runner's answer has no integer {key!r}")
    return value


def _bool(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"the runner's answer has no boolean {key!r}")
    return value


def _list(raw: Mapping[str, Any], key: str) -> list[Any]:
    value = raw.get(key)
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        raise ValueError(f"the runner's answer has no list {key!r}")
    return value


WorkspaceEntryType = Literal["file", "directory", "symlink"]


class WorkspaceEntryOut(TypedDict):
    """A file, folder or symlink of the workspace (a symlink is not followed)."""

    object: Literal["session.environment.filesystem.entry"]
    path: Annotated[str, Doc("relative to the workspace root")]
    name: str
    type: WorkspaceEntryType
    bytes: Annotated[int | None, Doc("a file's size; null for folders and symlinks")]
    modified_at: Annotated[int, Doc("Unix seconds")]


def workspace_entry_body(raw: Mapping[str, Any]) -> WorkspaceEntryOut:
    kind = raw.get("type")
    if kind not in ("file", "directory", "symlink"):
        raise ValueError("the runner's answer has no entry type")
    return {
        "object": "session.environment.filesystem.entry",
        "path": _str(raw, "path"),
        "name": _str(raw, "name"),
        "type": kind,
        "bytes": _int(raw, "bytes", nullable=True),
        "modified_at": _int(raw, "modified_at"),
    }


class WorkspaceListing(ObjectList[WorkspaceEntryOut]):
    """A folder of the workspace: folders first, then by name."""

    has_more: bool
    last_id: Annotated[str | None, Doc("the last entry's name: `after` for the next page")]


def workspace_listing_body(raw: Mapping[str, Any]) -> WorkspaceListing:
    last_id = raw.get("last_id")
    return {
        "object": "list",
        "data": [workspace_entry_body(row) for row in _list(raw, "data")],
        "has_more": _bool(raw, "has_more"),
        "last_id": last_id if isinstance(last_id, str) else None,
    }


class WorkspaceFileOut(TypedDict):
    """A file of the workspace with its content (cut at the read limit)."""

    object: Literal["session.environment.filesystem.file"]
    path: str
    bytes: Annotated[int, Doc("the whole file's size")]
    modified_at: Annotated[int, Doc("Unix seconds")]
    encoding: Literal["utf-8", "base64"]
    content: Annotated[str, Doc("text (utf-8) or base64 of the bytes (anything else)")]
    truncated: Annotated[bool, Doc("the content stops at OMNIGENT_WORKSPACE_READ_MAX_BYTES")]


def workspace_file_body(raw: Mapping[str, Any]) -> WorkspaceFileOut:
    encoding = raw.get("encoding")
    if encoding not in ("utf-8", "base64"):
        raise ValueError("the runner's answer has no encoding")
    return {
        "object": "session.environment.filesystem.file",
        "path": _str(raw, "path"),
        "bytes": _int(raw, "bytes"),
        "modified_at": _int(raw, "modified_at"),
        "encoding": encoding,
        "content": _str(raw, "content"),
        "truncated": _bool(raw, "truncated"),
    }


class SearchHitOut(TypedDict):
    path: str
    line: Annotated[int, Doc("1-based")]
    text: Annotated[str, Doc("the matching line (long lines are cut)")]


class SearchResults(ObjectList[SearchHitOut]):
    """Matching lines; bounded by files scanned, results and time."""

    truncated: Annotated[bool, Doc("a bound was hit: there may be more matches")]


def search_results_body(raw: Mapping[str, Any]) -> SearchResults:
    return {
        "object": "list",
        "data": [
            {"path": _str(row, "path"), "line": _int(row, "line"), "text": _str(row, "text")}
            for row in _list(raw, "data")
        ],
        "truncated": _bool(raw, "truncated"),
    }
