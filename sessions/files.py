"""Session files (files.md §1): every write, the reads that decide access, and the
``input_file`` / ``input_image`` message blocks that point at them.

Bytes live in ``file_store`` (content-addressed); rows are ``SessionFile`` (one per
session file) and ``FileBlob`` (one per stored hash, the lock row). A hash's bytes
are removed by ``collect_blobs`` once no ``SessionFile`` refers to it; everything
that removes rows (deleting a file, deleting a session) calls it after its commit.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from audit import actions as audit_actions
from audit import services as audit
from omnigent_site.domain_errors import InvalidInput, NotFound, PayloadTooLarge

from . import file_store, file_types
from .eventlog import record_event
from .models import FileBlob, Session, SessionFile
from .stream_events import resource_created_event, resource_deleted_event

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

FILE_BLOCK_TYPES = ("input_file", "input_image")


# --- reads ------------------------------------------------------------------------------


def session_files(*, session: Session) -> QuerySet[SessionFile]:
    return SessionFile.objects.filter(session=session)


def session_file(*, session: Session, file_id: str) -> SessionFile:
    found = SessionFile.objects.filter(session=session, pk=file_id).first()
    if found is None:
        raise NotFound(f"file {file_id!r} not found in this session")
    return found


# --- writes -----------------------------------------------------------------------------


def _lock_blob(*, sha256: str, size: int) -> None:
    """Take (creating if needed) the hash's ``FileBlob`` row lock, inside a transaction."""
    if FileBlob.objects.select_for_update().filter(pk=sha256).exists():
        return
    try:
        with transaction.atomic():
            FileBlob.objects.create(sha256=sha256, bytes=size)
    except IntegrityError:
        # Created by a concurrent upload meanwhile: wait for its lock instead.
        FileBlob.objects.select_for_update().filter(pk=sha256).get()


def add_session_file(
    *, session: Session, user: AuthUser, name: str, writer: file_store.BlobWriter
) -> SessionFile:
    """Keep the bytes ``writer`` holds as a file of ``session``; 400/415 say why not.

    On any failure the temporary bytes are removed and no row exists; bytes placed by
    this call are collected again if the row could not be stored.
    """
    placed = False
    try:
        file_types.check_filename(name)
        sha256 = writer.sha256 or writer.finish()
        content_type = file_types.detect_type(name=name, head=writer.head, is_text=writer.is_text)
        with transaction.atomic():
            _lock_blob(sha256=sha256, size=writer.size)
            placed = writer.place()
            row = SessionFile.objects.create(
                session=session,
                blob_id=sha256,
                name=name,
                bytes=writer.size,
                content_type=content_type,
                created_by=user,
            )
            record_event(session_id=session.id, payload=resource_created_event(row))
        return row
    except BaseException:
        writer.discard()
        if placed or writer.sha256:
            collect_blobs([writer.sha256])
        raise


def delete_session_file(
    *, session: Session, file: SessionFile, actor: AuthUser | None = None
) -> None:
    sha256 = file.sha256
    with transaction.atomic():
        deleted, _ = SessionFile.objects.filter(pk=file.pk, session=session).delete()
        if not deleted:
            raise NotFound(f"file {file.pk!r} not found in this session")
        audit.record(
            actor=actor,
            action=audit_actions.FILE_DELETE,
            target_type="file",
            target_id=file.pk,
            session_id=session.id,
            details={"name": file.name, "sha256": sha256, "bytes": file.bytes},
        )
        record_event(
            session_id=session.id,
            payload=resource_deleted_event(session_id=session.id, resource_id=file.pk),
        )
    collect_blobs([sha256])


def collect_blobs(hashes: Iterable[str]) -> None:
    """Remove the bytes (and ``FileBlob`` row) of each hash no session file refers to.

    Each hash in its own transaction holding the blob's row lock, which an upload of
    the same bytes also takes: an upload either committed its row before (the bytes
    stay) or places the bytes again after (its lock waits for this one).
    """
    for sha256 in dict.fromkeys(hashes):
        if not sha256:
            continue
        with transaction.atomic():
            blob = FileBlob.objects.select_for_update().filter(pk=sha256).first()
            if SessionFile.objects.filter(blob_id=sha256).exists():
                continue
            file_store.remove_blob(sha256)
            if blob is not None:
                blob.delete()


def session_blob_hashes(*, session: Session) -> list[str]:
    """The hashes a session's files use (read before deleting the session)."""
    return list(
        SessionFile.objects.filter(session=session).values_list("blob_id", flat=True).distinct()
    )


def copy_files(*, source: Session, target: Session, user: AuthUser) -> dict[str, str]:
    """Copy the source's file rows to ``target`` by reference (same bytes); old → new id.

    Runs inside the caller's transaction. The copies keep name, type and ``created_at``.
    """
    mapping: dict[str, str] = {}
    originals = list(SessionFile.objects.filter(session=source).order_by("created_at", "id"))
    copies = []
    for original in originals:
        copy = SessionFile(
            session=target,
            blob_id=original.blob_id,
            name=original.name,
            bytes=original.bytes,
            content_type=original.content_type,
            created_by=user,
        )
        copies.append(copy)
        mapping[original.pk] = copy.pk
    SessionFile.objects.bulk_create(copies)
    for copy, original in zip(copies, originals, strict=True):
        copy.created_at = original.created_at
    SessionFile.objects.bulk_update(copies, ["created_at"])
    return mapping


# --- message blocks ---------------------------------------------------------------------


def _file_blocks(data: dict[str, Any]) -> list[dict[str, Any]]:
    content = data.get("content")
    if not isinstance(content, list):
        return []
    return [
        part for part in content if isinstance(part, dict) and part.get("type") in FILE_BLOCK_TYPES
    ]


def has_file_blocks(data: dict[str, Any]) -> bool:
    """Cheap check (no database): does this message point at session files?"""
    return bool(_file_blocks(data))


def _data_uri_length(size: int, content_type: str) -> int:
    return len(f"data:{content_type};base64,") + 4 * ((size + 2) // 3)


def prepare_message_files(*, session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Check a user message's file blocks before anything is stored; fill in ``filename``.

    Every ``file_id`` must be a file of this session (another session's, deleted or
    unknown → 400), an ``input_image`` must point at an image, and the turn input the
    runner will get (the bytes as base64 data URIs) must fit in one tunnel frame
    (``OMNIGENT_MAX_FRAME_BYTES``) → else 413. The stored blocks keep ``file_id`` and
    the file's name; the bytes are added only when the turn is sent
    (``expand_file_blocks``).
    """
    blocks = _file_blocks(data)
    wanted: list[str] = []
    for block in blocks:
        file_id = block.get("file_id")
        if not isinstance(file_id, str) or not file_id:
            raise InvalidInput(f"an {block['type']} block needs a string 'file_id'", field="data")
        if "filename" in block and not isinstance(block["filename"], str):
            raise InvalidInput("'filename' must be a string", field="data")
        wanted.append(file_id)
    found = {
        row.pk: row for row in SessionFile.objects.filter(session_id=session_id, pk__in=wanted)
    }
    estimate = len(json.dumps(data, ensure_ascii=False).encode("utf-8")) + 4096
    content = []
    for part in data["content"]:
        if not (isinstance(part, dict) and part.get("type") in FILE_BLOCK_TYPES):
            content.append(part)
            continue
        row = found.get(part["file_id"])
        if row is None:
            raise InvalidInput(
                f"file {part['file_id']!r} is not a file of this session", field="data"
            )
        if part["type"] == "input_image" and not file_types.is_image_type(row.content_type):
            raise InvalidInput(
                f"input_image needs an image file; {row.pk!r} is {row.content_type}",
                field="data",
            )
        estimate += _data_uri_length(row.bytes, row.content_type) + 256
        content.append({**part, "filename": part.get("filename") or row.name})
    limit = int(settings.OMNIGENT_MAX_FRAME_BYTES)
    if limit and estimate > limit:
        raise PayloadTooLarge(
            f"the message with its files would be about {estimate} bytes; a turn's input "
            f"must fit in one tunnel frame ({limit} bytes)"
        )
    return {**data, "content": content}


def expand_file_blocks(*, session_id: str, item: dict[str, Any]) -> dict[str, Any]:
    """A flat user item with its file blocks carrying the bytes, for ``turn.start``.

    ``input_image`` gets ``image_url`` (a data URI); ``input_file`` gets ``file_data``
    (a data URI) and ``filename``. A block whose file was deleted since is sent
    without bytes, and the runner tells the model the file is not available.
    """
    blocks = _file_blocks(item)
    if not blocks:
        return item
    rows = {
        row.pk: row
        for row in SessionFile.objects.filter(
            session_id=session_id, pk__in=[block.get("file_id") for block in blocks]
        )
    }
    content = []
    for part in item["content"]:
        row = rows.get(str(part.get("file_id"))) if isinstance(part, dict) else None
        if row is None or part.get("type") not in FILE_BLOCK_TYPES:
            content.append(part)
            continue
        try:
            raw = file_store.read_blob(row.sha256)
        except FileNotFoundError:
            log.error("session file %s: bytes %s missing from the store", row.pk, row.sha256)
            content.append(part)
            continue
        uri = f"data:{row.content_type};base64," + base64.b64encode(raw).decode("ascii")
        if part["type"] == "input_image":
            content.append({**part, "image_url": uri})
        else:
            content.append({**part, "file_data": uri, "filename": part.get("filename") or row.name})
    return {**item, "content": content}


def remap_file_ids(data: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """A copied item's file blocks pointing at the fork's copies of the files."""
    content = data.get("content")
    if not isinstance(content, list) or not mapping:
        return data
    changed = [
        {**part, "file_id": mapping[part["file_id"]]}
        if isinstance(part, dict)
        and part.get("type") in FILE_BLOCK_TYPES
        and part.get("file_id") in mapping
        else part
        for part in content
    ]
    return {**data, "content": changed}
