"""Store the change sets runners report (``workspace.changes``, tunnel.md)."""

from __future__ import annotations

from typing import Any

from omnigent_runner.tools.changes import diff_line_counts
from sessions.models import Session

from .models import FileChange

ENTRY_FIELDS = ("bytes", "modified_at", "lines_added", "lines_removed")
MAX_PATH = 1024


def _clean_entry(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError("a change entry must be an object")
    path = raw.get("path")
    if not isinstance(path, str) or not path or len(path) > MAX_PATH or "\x00" in path:
        raise ValueError("a change entry needs a relative 'path'")
    status = raw.get("status")
    if status not in {*FileChange.Status.values, "none"}:
        raise ValueError(f"unknown change status {status!r}")
    entry: dict[str, Any] = {"path": path, "status": status}
    entry["name"] = str(raw.get("name") or path.rsplit("/", 1)[-1])
    for key in ENTRY_FIELDS:
        value = raw.get(key)
        entry[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    for key in ("before", "after"):
        if key in raw:
            value = raw[key]
            entry[key] = value if isinstance(value, str) else None
    # Who made the latest change; an entry without it keeps the stored attribution.
    if raw.get("attribution") in FileChange.Attribution.values:
        entry["attribution"] = raw["attribution"]
    return entry


def _merge_agent_edit(stored: FileChange, entry: dict[str, Any]) -> dict[str, Any]:
    """An agent_edit entry for a path the session already has a record of.

    The runner's tracker only knows the operations since it was made, and a restarted
    runner (or a re-opened session) starts a fresh one: its first operation on a path is
    not the session's first. The stored row stands for the session's first operation
    (``created``: the file did not exist; otherwise it did) and keeps its diff baseline,
    so the net status (agents.md table) and ``before`` come from it. For an entry from
    the tracker that recorded the row this changes nothing.
    """
    first_existed = stored.status != FileChange.Status.CREATED
    exists_now = entry["status"] in (FileChange.Status.CREATED, FileChange.Status.MODIFIED)
    if exists_now:
        status = "modified" if first_existed else "created"
    else:
        status = "deleted" if first_existed else "none"
    merged = {**entry, "status": status}
    merged.pop("before", None)  # keep the stored baseline
    if status != entry["status"] or ("before" in entry and entry["before"] != stored.before):
        before_side = stored.before if first_existed else ""
        after_side = entry.get("after", stored.after) if exists_now else ""
        added: int | None
        removed: int | None
        if isinstance(before_side, str) and isinstance(after_side, str):
            added, removed = diff_line_counts(before_side, after_side)
        else:
            added = removed = None
        merged["lines_added"], merged["lines_removed"] = added, removed
    return merged


def apply_workspace_changes(*, session: Session, payload: dict[str, Any]) -> str:
    """Apply one ``workspace.changes`` payload; returns its environment id.

    ``git`` payloads carry the full set and replace what is stored; ``agent_edit``
    payloads carry only the paths that changed (status ``none`` drops a path), merged
    with what is stored for the path (:func:`_merge_agent_edit`).
    An entry without ``before``/``after`` keys keeps the stored contents.
    Must run inside the caller's transaction.
    """
    environment_id = payload.get("environment_id") or "default"
    if not isinstance(environment_id, str) or len(environment_id) > 64:
        raise ValueError("'environment_id' must be a short string")
    mode = payload.get("mode")
    if mode not in ("git", "agent_edit"):
        raise ValueError(f"unknown change tracking mode {mode!r}")
    raw_entries = payload.get("entries")
    if not isinstance(raw_entries, list):
        raise ValueError("'entries' must be a list")
    entries = [_clean_entry(raw) for raw in raw_entries]
    stored = FileChange.objects.filter(session=session, environment_id=environment_id)
    if mode == "git":
        keep = [entry["path"] for entry in entries if entry["status"] != "none"]
        stored.exclude(path__in=keep).delete()
    existing = {
        change.path: change for change in stored.filter(path__in=[e["path"] for e in entries])
    }
    for entry in entries:
        change = existing.get(entry["path"])
        if mode == "agent_edit" and change is not None:
            entry = _merge_agent_edit(change, entry)
        if entry["status"] == "none":
            if change is not None:
                change.delete()
            continue
        if change is None:
            change = FileChange(session=session, environment_id=environment_id, path=entry["path"])
        updates = {key: value for key, value in entry.items() if key not in ("path",)}
        if change.pk and all(getattr(change, key) == value for key, value in updates.items()):
            continue  # unchanged: keep its place in the most-recent-first order
        for key, value in updates.items():
            setattr(change, key, value)
        change.save()
    return environment_id
