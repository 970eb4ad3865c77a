"""Export of a session as NDJSON and import of such a file (lifecycle.md, Export and
import).

An export is one ``session_meta`` line, then one ``item`` line per item in order (the
items API's flat shape), one ``turn`` line per turn and, when asked, one ``file`` line
per session file with its bytes in base64. It is read in batches and written a line
at a time (``export_chunks``), so its memory does not grow with the session.

An import reads the uploaded file twice: once to check every line (a bad one is a 400
naming its number and nothing is stored), once to store, in one transaction, a new
session owned by the importer with the items (new ids, their original ``created_at``
and ``created_by``), the turns (their ids are per session, so they are kept, as a fork
keeps them) and the files (new ids; message blocks that name them are rewritten).
A file whose ``session_meta`` has no ``format`` is the reference's client-side export:
its items are stored under one turn whose id is ``seed``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner.json_text import loads
from omnigent_site.domain_errors import InvalidInput, PayloadTooLarge
from omnigent_site.ids import new_item_id
from omnigent_site.rawsql import insert_rows
from omnigent_site.timeutil import unix

from . import file_store, files, updates, webhook_events
from .models import Agent, Item, Permission, Session, SessionFile, Turn
from .services import normalise_initial_item
from .shapes import session_file_body, session_row

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

FORMAT = 1
SEED_TURN = "seed"
BATCH = 500
# Raw bytes per base64 piece of a file line (a multiple of 3: pieces join cleanly).
FILE_PIECE = 3 * 64 * 1024


def _line(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def agent_ref(agent: Agent) -> dict[str, Any]:
    return {"id": agent.id, "name": agent.name, "bundle_sha256": agent.bundle_sha256}


def turn_line(turn: Turn) -> dict[str, Any]:
    return {
        "type": "turn",
        "turn": {
            "id": turn.id,
            "object": "response",
            "status": turn.status,
            "error": turn.error,
            "created_at": unix(turn.created_at),
            "completed_at": unix(turn.completed_at),
        },
    }


def record_export(*, session: Session, user: AuthUser, with_files: bool) -> None:
    """The audit record of an export, written before its first byte leaves."""
    with transaction.atomic():
        audit.record(
            actor=user,
            action=audit_actions.SESSION_EXPORT,
            target_type="session",
            target_id=session.id,
            session_id=session.id,
            details={"files": with_files},
        )


def export_chunks(*, session: Session, level: int, with_files: bool) -> Iterator[bytes]:
    """The export, a batch of lines per chunk. Each chunk is read when it is asked for,
    in its own statement (no cursor stays open between chunks)."""
    meta = {
        "type": "session_meta",
        "session": session_row(session, level=level),
        "agent": agent_ref(session.agent),
        "exported_at": unix(timezone.now()),
        "format": FORMAT,
    }
    yield _line(meta)
    last = 0
    while True:
        batch = list(
            Item.objects.filter(session_id=session.id, seq__gt=last).order_by("seq")[:BATCH]
        )
        if not batch:
            break
        last = batch[-1].seq
        yield b"".join(_line({"type": "item", "item": item.flat()}) for item in batch)
    last = 0
    while True:
        turns = list(
            Turn.objects.filter(session_id=session.id, seq__gt=last).order_by("seq")[:BATCH]
        )
        if not turns:
            break
        last = turns[-1].seq
        yield b"".join(_line(turn_line(turn)) for turn in turns)
    if with_files:
        for row in SessionFile.objects.filter(session_id=session.id).order_by("created_at", "id"):
            yield from _file_line(row)


def _file_line(row: SessionFile) -> Iterator[bytes]:
    """One ``file`` line in pieces: the bytes are read and encoded a piece at a time."""
    head = json.dumps(session_file_body(row), ensure_ascii=False, separators=(",", ":"))
    yield b'{"type":"file","file":' + head[:-1].encode() + b',"content_base64":"'
    with file_store.open_blob(row.sha256) as handle:
        while piece := handle.read(FILE_PIECE):
            yield base64.b64encode(piece)
    yield b'"}}\n'


# --- import -----------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the first pass learned: enough to store without reading twice in memory."""

    reference: bool = False
    title: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    agent_sha256: str | None = None
    turn_ids: set[str] = field(default_factory=set)
    response_ids: dict[str, int] = field(default_factory=dict)  # id -> first line naming it
    items: int = 0


def _lines(upload: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    upload.seek(0)
    for number, raw in enumerate(upload, start=1):
        if not raw.strip():
            continue
        try:
            value = loads(raw)
        except Exception as exc:  # noqa: BLE001 - every refusal names the line
            raise InvalidInput(f"line {number}: {exc}", field="file") from None
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise InvalidInput(f"line {number}: not an object with a 'type'", field="file")
        yield number, value


def _bad(number: int, message: str) -> InvalidInput:
    return InvalidInput(f"line {number}: {message}", field="file")


def _object(number: int, line: dict[str, Any], key: str) -> dict[str, Any]:
    value = line.get(key)
    if not isinstance(value, dict):
        raise _bad(number, f"'{key}' must be an object")
    return value


def _timestamp(number: int, value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(number, f"'{name}' must be Unix seconds")
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise _bad(number, f"'{name}' is out of range") from None


def _item(number: int, line: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(stored fields, raw item)``; a 400 naming the line if it cannot be stored."""
    raw = _object(number, line, "item")
    try:
        prepared = normalise_initial_item(raw)
    except InvalidInput as exc:
        raise _bad(number, exc.message) from None
    response_id = raw.get("response_id")
    if response_id is not None and not isinstance(response_id, str):
        raise _bad(number, "'response_id' must be a string or null")
    created_by = raw.get("created_by")
    if created_by is not None and (not isinstance(created_by, str) or len(created_by) > 254):
        raise _bad(number, "'created_by' must be a string (254 characters at most) or null")
    if len(prepared["type"]) > 64 or len(prepared["status"]) > 32:
        raise _bad(number, "the item's 'type' or 'status' is too long")
    prepared["created_at"] = _timestamp(number, raw.get("created_at"), "created_at")
    prepared["created_by"] = created_by
    prepared["response_id"] = response_id
    return prepared, raw


def _turn(number: int, line: dict[str, Any]) -> dict[str, Any]:
    raw = _object(number, line, "turn")
    turn_id = raw.get("id")
    if not isinstance(turn_id, str) or not turn_id or len(turn_id) > 64:
        raise _bad(number, "a turn needs a string 'id' of 64 characters or fewer")
    status = raw.get("status")
    if status not in Turn.Status.values:
        raise _bad(number, f"unknown turn status {status!r}")
    if status in Turn.OPEN_STATUSES:
        # An imported session has no runner working on it: a turn still open is over.
        status = Turn.Status.CANCELLED
    error = raw.get("error")
    if error is not None and not isinstance(error, dict):
        raise _bad(number, "a turn's 'error' must be an object or null")
    return {
        "id": turn_id,
        "status": status,
        "error": error,
        "created_at": _timestamp(number, raw.get("created_at"), "created_at"),
        "completed_at": _timestamp(number, raw.get("completed_at"), "completed_at"),
    }


def _file(number: int, line: dict[str, Any]) -> tuple[str, str, str]:
    """``(old id, name, base64)`` of a file line."""
    raw = _object(number, line, "file")
    old_id, name, content = raw.get("id"), raw.get("name"), raw.get("content_base64")
    if not isinstance(old_id, str) or not isinstance(name, str) or not name:
        raise _bad(number, "a file needs a string 'id' and 'name'")
    if not isinstance(content, str):
        raise _bad(number, "a file needs its bytes as a string 'content_base64'")
    if len(content) // 4 * 3 > settings.OMNIGENT_MAX_UPLOAD_BYTES:
        raise _bad(number, f"the file is larger than {settings.OMNIGENT_MAX_UPLOAD_BYTES} bytes")
    try:
        base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(number, "'content_base64' is not base64") from None
    return old_id, name, content


def _check(upload: IO[bytes]) -> _Plan:
    plan = _Plan()
    seen_meta = False
    for number, line in _lines(upload):
        kind = line["type"]
        if not seen_meta:
            if kind != "session_meta":
                raise _bad(number, "the first line must be the 'session_meta' line")
            seen_meta = True
            _meta(number, line, plan)
        elif kind == "item":
            prepared, _raw = _item(number, line)
            plan.items += 1
            if prepared["response_id"] is not None:
                plan.response_ids.setdefault(prepared["response_id"], number)
        elif kind == "turn" and not plan.reference:
            turn = _turn(number, line)
            if turn["id"] in plan.turn_ids:
                raise _bad(number, f"turn {turn['id']!r} appears twice")
            plan.turn_ids.add(turn["id"])
        elif kind == "file" and not plan.reference:
            _file(number, line)
        else:
            raise _bad(number, f"unknown line type {kind!r}")
    if not seen_meta:
        raise InvalidInput("the file is empty: no 'session_meta' line", field="file")
    if not plan.reference:
        for response_id, number in plan.response_ids.items():
            if response_id not in plan.turn_ids:
                raise _bad(number, f"the item names turn {response_id!r}, which has no line")
    return plan


def _meta(number: int, line: dict[str, Any], plan: _Plan) -> None:
    exported = line.get("format")
    if exported is None:
        plan.reference = True
    elif exported != FORMAT:
        raise _bad(number, f"unknown export format {exported!r} (this server reads {FORMAT})")
    session = line.get("session") if isinstance(line.get("session"), dict) else line
    assert isinstance(session, dict)
    title = session.get("title")
    if title is not None and (not isinstance(title, str) or len(title) > 512):
        raise _bad(number, "the session's 'title' must be a string of 512 characters or fewer")
    labels = session.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in labels.items()
    ):
        raise _bad(number, "the session's 'labels' must map strings to strings")
    plan.title, plan.labels = title, labels
    agent = line.get("agent")
    if agent is not None:
        if not isinstance(agent, dict):
            raise _bad(number, "'agent' must be an object")
        sha256 = agent.get("bundle_sha256")
        if sha256 is not None and not isinstance(sha256, str):
            raise _bad(number, "the agent's 'bundle_sha256' must be a string")
        plan.agent_sha256 = sha256


def _agent_by_bundle(*, sha256: str | None, user: AuthUser) -> Agent:
    """A template with this bundle, else a session agent with it the user can read."""
    if not sha256:
        raise InvalidInput(
            "the export names no agent bundle: give the agent to use as 'agent_id'",
            field="agent_id",
        )
    usable = Agent.objects.filter(bundle_sha256=sha256, deleted_at__isnull=True)
    template = usable.filter(kind=Agent.Kind.TEMPLATE).order_by("created_at").first()
    if template is not None:
        return template
    readable = Permission.objects.filter(user=user).values("session__agent_id")
    own = usable.filter(pk__in=readable).order_by("created_at").first()
    if own is None:
        raise InvalidInput(
            f"no agent you can use has the exported bundle (sha256 {sha256}): upload it as "
            "an agent or give 'agent_id'",
            field="agent_id",
        )
    return own


def _store_files(
    upload: IO[bytes], *, session: Session, user: AuthUser, placed: list[str]
) -> dict[str, str]:
    """Store every file line; ``placed`` gets each stored hash (collected on failure)."""
    mapping: dict[str, str] = {}
    for number, line in _lines(upload):
        if line["type"] != "file":
            continue
        old_id, name, content = _file(number, line)
        writer = file_store.BlobWriter(limit=settings.OMNIGENT_MAX_UPLOAD_BYTES)
        try:
            for start in range(0, len(content), 4 * 64 * 1024):
                writer.write(base64.b64decode(content[start : start + 4 * 64 * 1024]))
        except file_store.TooLarge:
            raise PayloadTooLarge(f"line {number}: the file is too large") from None
        except BaseException:
            writer.discard()
            raise
        try:
            row = files.add_session_file(session=session, user=user, name=name, writer=writer)
        except InvalidInput as exc:
            raise _bad(number, exc.message) from None
        placed.append(row.sha256)
        mapping[old_id] = row.pk
    return mapping


def _store_rows(
    upload: IO[bytes], *, session: Session, plan: _Plan, file_ids: dict[str, str]
) -> None:
    now = timezone.now()
    turns: list[Turn] = []
    if plan.reference and plan.items:
        turns.append(
            Turn(
                session=session,
                id=SEED_TURN,
                status=Turn.Status.COMPLETED,
                created_at=now,
                completed_at=now,
            )
        )
    items: list[Item] = []
    for number, line in _lines(upload):
        if line["type"] == "turn":
            turn = _turn(number, line)
            turns.append(
                Turn(
                    session=session,
                    id=turn["id"],
                    status=turn["status"],
                    error=turn["error"],
                    created_at=turn["created_at"] or now,
                    completed_at=turn["completed_at"],
                )
            )
        elif line["type"] == "item":
            prepared, _raw = _item(number, line)
            items.append(
                Item(
                    session=session,
                    id=new_item_id(),
                    response_id=SEED_TURN if plan.reference else prepared["response_id"],
                    type=prepared["type"],
                    status=prepared["status"],
                    data=files.remap_file_ids(prepared["data"], file_ids),
                    created_by=prepared["created_by"],
                    created_at=prepared["created_at"] or now,
                )
            )
            if len(items) >= BATCH:
                insert_rows(Item, items, as_given=True)
                items = []
    insert_rows(Item, items, as_given=True)
    insert_rows(Turn, turns, as_given=True)


def import_session(
    *, user: AuthUser, upload: IO[bytes], size: int, agent: Agent | None = None
) -> Session:
    """A new session of ``user`` from an export; all or nothing."""
    if size > settings.OMNIGENT_MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(
            f"the file is {size} bytes; the limit is {settings.OMNIGENT_MAX_UPLOAD_BYTES}"
        )
    plan = _check(upload)
    if agent is None:
        agent = _agent_by_bundle(sha256=plan.agent_sha256, user=user)
    stored: list[str] = []
    try:
        with transaction.atomic():
            session = Session.objects.create(
                agent=agent, title=plan.title, labels=plan.labels, created_by=user
            )
            Permission.objects.create(session=session, user=user, level=Permission.Level.OWNER)
            file_ids = _store_files(upload, session=session, user=user, placed=stored)
            _store_rows(upload, session=session, plan=plan, file_ids=file_ids)
            audit.record(
                actor=user,
                action=audit_actions.SESSION_IMPORT,
                target_type="session",
                target_id=session.id,
                session_id=session.id,
                details={
                    "agent_id": agent.id,
                    "items": plan.items,
                    "files": len(file_ids),
                    "reference_format": plan.reference,
                },
            )
            updates.announce_session(session_id=session.id, kind=updates.ADDED)
            webhook_events.session_created(session)
    except BaseException:
        files.collect_blobs(stored)
        raise
    session.refresh_from_db()
    return session


def lines_of(chunks: Iterable[bytes]) -> list[dict[str, Any]]:
    """The parsed lines of an export (tests and the benchmark)."""
    return [json.loads(line) for line in b"".join(chunks).splitlines() if line.strip()]
