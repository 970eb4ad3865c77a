"""``GET /v1/sessions/{id}/export`` and ``POST /v1/sessions/import`` (lifecycle.md,
Export and import): the line format, a round trip with files, the reference's
client-side lines, all-or-nothing 400s that name the line, and who may do what."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from sessions.models import Agent, Item, Session, SessionFile, Turn

from .conftest import ALICE, BOB, assert_error, upload

pytestmark = pytest.mark.django_db

REFERENCE = Path(__file__).parent / "data" / "reference-client-export.jsonl"


@pytest.fixture
def template(client_for, make_bundle) -> str:
    response = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(make_bundle("tmpl"))}, format="multipart"
    )
    assert response.status_code == 201
    return response.json()["id"]


@pytest.fixture
def session(client_for, template) -> str:
    """A session with a turn, items of each kind, a file and a message naming it."""
    items = [
        {"type": "message", "role": "user", "content": "look at the report"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]
    body = {"agent_id": template, "title": "Report", "labels": {"k": "v"}, "initial_items": items}
    response = client_for(ALICE).post("/v1/sessions", body, format="json")
    assert response.status_code == 201, response.content
    session_id = response.json()["id"]
    uploaded = client_for(ALICE).post(
        f"/v1/sessions/{session_id}/resources/files",
        {"file": SimpleUploadedFile("notes.txt", b"hello file\n", content_type="text/plain")},
        format="multipart",
    )
    assert uploaded.status_code == 201, uploaded.content
    file_id = uploaded.json()["id"]
    turn = Turn.objects.create(
        session_id=session_id, id="resp_1", status="completed", completed_at=timezone.now()
    )
    Item.objects.create(
        session_id=session_id,
        id="item_file",
        response_id=turn.id,
        type="message",
        data={
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see the file"},
                {"type": "input_file", "file_id": file_id},
            ],
        },
        created_by=ALICE,
    )
    Item.objects.create(
        session_id=session_id,
        id="item_answer",
        response_id=turn.id,
        type="message",
        data={"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    )
    return session_id


def export(client, session_id: str, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"/v1/sessions/{session_id}/export", params)
    assert response.status_code == 200, response.content
    assert response.streaming
    assert response["Content-Type"].startswith("application/x-ndjson")
    raw = b"".join(response)
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.splitlines()]


def do_import(client, content: bytes, **parts: Any):
    data = {"file": SimpleUploadedFile("export.jsonl", content, "application/x-ndjson"), **parts}
    return client.post("/v1/sessions/import", data, format="multipart")


def encode(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_export_lines(client_for, session) -> None:
    lines = export(client_for(ALICE), session)
    meta = lines[0]
    assert meta["type"] == "session_meta" and meta["format"] == 1
    assert meta["session"]["id"] == session and "items" not in meta["session"]
    agent = Agent.objects.get(sessions__id=session)
    assert meta["agent"] == {
        "id": agent.id,
        "name": agent.name,
        "bundle_sha256": agent.bundle_sha256,
    }
    assert isinstance(meta["exported_at"], int)
    kinds = [line["type"] for line in lines[1:]]
    assert kinds == ["item"] * 5 + ["turn"]
    listed = client_for(ALICE).get(f"/v1/sessions/{session}/items").json()["data"]
    assert [line["item"] for line in lines[1:6]] == listed
    assert lines[6]["turn"]["id"] == "resp_1"
    with_files = export(client_for(ALICE), session, files=1)
    (file_line,) = [line for line in with_files if line["type"] == "file"]
    assert base64.b64decode(file_line["file"]["content_base64"]) == b"hello file\n"
    assert file_line["file"]["name"] == "notes.txt"


def _without_import_ids(lines: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        line = json.loads(json.dumps(line))
        if line["type"] == "session_meta":
            for key in ("id", "created_at", "updated_at"):
                line["session"].pop(key)
            line.pop("exported_at")
        elif line["type"] == "item":
            line["item"].pop("id")
            for part in line["item"].get("content", []):
                part.pop("file_id", None)
        elif line["type"] == "file":
            for key in ("id", "session_id"):
                line["file"].pop(key)
            line["file"]["metadata"].pop("created_at")
        out.append(line)
    return out


def test_round_trip(client_for, session) -> None:
    client = client_for(ALICE)
    first = export(client, session, files=1)
    response = do_import(client, encode(first))
    assert response.status_code == 201, response.content
    imported = response.json()
    assert imported["id"] != session and imported["title"] == "Report"
    assert imported["permission_level"] == 4
    second = export(client, imported["id"], files=1)
    assert _without_import_ids(second) == _without_import_ids(first)
    # The message names the imported file, not the original.
    new_file = SessionFile.objects.get(session_id=imported["id"])
    blocks = [
        part
        for line in second
        if line["type"] == "item"
        for part in line["item"].get("content", [])
        if part.get("type") == "input_file"
    ]
    assert blocks == [{"type": "input_file", "file_id": new_file.pk}]
    # Items keep their original time and author.
    originals = list(Item.objects.filter(session_id=session).order_by("seq"))
    copies = list(Item.objects.filter(session_id=imported["id"]).order_by("seq"))
    assert [(i.created_at.replace(microsecond=0), i.created_by) for i in originals] == [
        (i.created_at, i.created_by) for i in copies
    ]


def test_reference_client_export(client_for, template) -> None:
    response = do_import(client_for(ALICE), REFERENCE.read_bytes(), agent_id=template)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["title"] == "Why is the nightly build red?"
    assert body["labels"] == {"team": "infra"}
    assert body["agent_id"] == template
    items = body["items"]
    assert [item["type"] for item in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert {item["response_id"] for item in items} == {"seed"}
    assert items[0]["created_by"] == ALICE and items[0]["created_at"] == 1764800010
    assert all(not item["id"].startswith(("msg_0", "fc_0")) for item in items)
    (turn,) = Turn.objects.filter(session_id=body["id"])
    assert (turn.id, turn.status) == ("seed", "completed")


def test_the_agent_is_found_by_its_bundle_or_named(client_for, session, template) -> None:
    lines = export(client_for(ALICE), session)
    # ALICE holds the template with that bundle: no agent_id needed.
    response = do_import(client_for(ALICE), encode(lines))
    assert response.status_code == 201, response.content
    # BOB can use the template too (templates are shared).
    assert do_import(client_for(BOB), encode(lines)).status_code == 201
    lines[0]["agent"]["bundle_sha256"] = "0" * 64
    error = assert_error(do_import(client_for(ALICE), encode(lines)), 400, "invalid_input")
    assert "0" * 64 in error["message"] and "agent_id" in error["message"]
    reference = REFERENCE.read_bytes()
    error = assert_error(do_import(client_for(ALICE), reference), 400, "invalid_input")
    assert "agent_id" in error["message"]
    assert_error(
        do_import(client_for(ALICE), reference, agent_id="agent_missing"), 404, "not_found"
    )


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b'{"type": "item", "item": {}}\n', 1),
        (
            b'{"type": "session_meta", "format": 1}\n{"type": "item", "item": {"type": "x"}}\nnot json\n',
            3,
        ),
        (b'{"type": "session_meta", "format": 1}\n\n{"type": "item", "item": {"type": 5}}\n', 3),
        (
            b'{"type": "session_meta", "format": 1}\n{"type": "item", "item": {"type": "x", "response_id": "r"}}\n',
            2,
        ),
        (
            b'{"type": "session_meta", "format": 1}\n{"type": "turn", "turn": {"id": "r", "status": "odd"}}\n',
            2,
        ),
        (
            b'{"type": "session_meta", "format": 1}\n{"type": "file", "file": {"id": "f", "name": "a", "content_base64": "!!"}}\n',
            2,
        ),
        (b'{"type": "session_meta", "format": 2}\n', 1),
        (b'{"type": "session_meta", "format": 1}\n{"type": "mystery"}\n', 2),
        (b"[1]\n", 1),
    ],
)
def test_a_bad_line_is_a_400_naming_it_and_nothing_is_stored(
    client_for, template, content: bytes, line: int
) -> None:
    before = (Session.objects.count(), Item.objects.count(), Turn.objects.count())
    response = do_import(client_for(ALICE), content, agent_id=template)
    error = assert_error(response, 400, "invalid_input")
    assert f"line {line}:" in error["message"], error
    assert (Session.objects.count(), Item.objects.count(), Turn.objects.count()) == before


def test_a_failure_while_storing_keeps_nothing(client_for, session, monkeypatch) -> None:
    lines = export(client_for(ALICE), session, files=1)
    from sessions import transfer

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(transfer, "insert_rows", boom)
    before = (Session.objects.count(), Item.objects.count(), SessionFile.objects.count())
    client = client_for(ALICE)
    client.raise_request_exception = False
    response = do_import(client, encode(lines))
    assert response.status_code == 500
    assert (Session.objects.count(), Item.objects.count(), SessionFile.objects.count()) == before


def test_access(client_for, session) -> None:
    assert_error(client_for(BOB).get(f"/v1/sessions/{session}/export"), 404, "not_found")
    assert client_for(None).get(f"/v1/sessions/{session}/export").status_code in (401, 403)
    response = client_for(ALICE).post("/v1/sessions/import", {}, format="multipart")
    assert_error(response, 400, "invalid_input", mentions="file")
    response = client_for(ALICE).post("/v1/sessions/import", {"a": 1}, format="json")
    assert_error(response, 415, "unsupported_media_type")


def test_import_size_limit(client_for, template, settings) -> None:
    settings.OMNIGENT_MAX_UPLOAD_BYTES = 100
    content = io.BytesIO(b'{"type": "session_meta", "format": 1}\n' + b" " * 200)
    response = do_import(client_for(ALICE), content.getvalue(), agent_id=template)
    assert_error(response, 413, "payload_too_large")


@pytest.mark.django_db(transaction=True)
async def test_export_streams_under_asgi(client_for, session) -> None:
    """Served by the ASGI handler (as daphne serves it): an async iterator reading one
    batch at a time on a thread, not the whole export read before the first byte."""
    from django.db import connection
    from django.test import AsyncClient

    if connection.vendor != "sqlite":
        pytest.skip(
            "Django's ASGI test handler leaves a connection open in its request thread, "
            "and PostgreSQL then cannot drop the test database; the path is the same"
        )
    client = AsyncClient()
    response = await client.get(
        f"/v1/sessions/{session}/export?files=1", headers={"X-Forwarded-Email": ALICE}
    )
    assert response.status_code == 200
    assert response.is_async
    raw = b"".join([chunk async for chunk in response.streaming_content])
    kinds = [json.loads(line)["type"] for line in raw.splitlines()]
    assert kinds == ["session_meta", *["item"] * 5, "turn", "file"]


def test_exports_and_imports_are_audited(client_for, session) -> None:
    from audit.models import AuditRecord

    lines = export(client_for(ALICE), session)
    imported = do_import(client_for(ALICE), encode(lines)).json()["id"]
    records = list(
        AuditRecord.objects.filter(action__in=["session.export", "session.import"]).order_by("id")
    )
    assert [(r.action, r.actor, r.session_id) for r in records] == [
        ("session.export", ALICE, session),
        ("session.import", ALICE, imported),
    ]
    # A refused import leaves no record.
    do_import(client_for(ALICE), b"nope\n")
    assert AuditRecord.objects.filter(action="session.import").count() == 1
