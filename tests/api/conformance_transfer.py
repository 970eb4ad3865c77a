"""Requests for the export and import endpoints, for ``test_schema_conformance``: each
status the schema documents for them, once."""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from .files_helpers import multipart

EXPORT = "/v1/sessions/{session_id}/export"
IMPORT = "/v1/sessions/import"


def _import(caller: Any, content: bytes, *fields: tuple[str, str]) -> Any:
    parts: list[tuple[str, str | None, bytes]] = [("file", "export.jsonl", content)]
    parts += [(name, None, value.encode()) for name, value in fields]
    body, content_type = multipart(parts)
    return caller("post", IMPORT, body, content_type=content_type)


def exercise_transfer(alice: Any, anon: Any, session_id: str) -> None:
    exported = alice("get", EXPORT, session_id=session_id)
    content = b"".join(exported)
    statuses = [
        exported,
        alice("get", EXPORT, query="?files=maybe", session_id=session_id),
        anon("get", EXPORT, session_id=session_id),
        alice("get", EXPORT, session_id="conv_unknown"),
        _import(alice, content),
        _import(alice, b"not json\n"),
        _import(anon, content),
        _import(alice, content, ("agent_id", "agent_unknown")),
        alice("post", IMPORT, {"file": "x"}),
    ]
    with override_settings(OMNIGENT_MAX_UPLOAD_BYTES=10):
        statuses.append(_import(alice, content))
    assert [r.status_code for r in statuses] == [200, 400, 401, 404, 201, 400, 401, 404, 415, 413]
