"""Requests for the session-file and fork endpoints, for ``test_schema_conformance``.

Each status the schema documents for these operations is produced here once; the
conformance test checks every response against the schema.
"""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from .files_helpers import ZIP_BYTES, multipart

SESSION = "/v1/sessions/{session_id}"
FILES = SESSION + "/resources/files"
FILE = FILES + "/{file_id}"
CONTENT = FILE + "/content"
FORK = SESSION + "/fork"


def _upload(caller: Any, session_id: str, name: str, data: bytes) -> Any:
    body, content_type = multipart([("file", name, data)])
    return caller("post", FILES, body, content_type=content_type, session_id=session_id)


def exercise_session_files(alice: Any, bob: Any, anon: Any, session_id: str) -> None:
    """``bob`` holds read access on ``session_id``; ``anon`` has no identity."""
    created = _upload(alice, session_id, "notes.txt", b"some notes")
    file_id = created.json()["id"]
    stranger = "conv_nobody"
    statuses = [
        created,
        _upload(alice, session_id, "a/b.txt", b"x"),
        _upload(anon, session_id, "a.txt", b"x"),
        _upload(bob, session_id, "a.txt", b"x"),
        _upload(alice, stranger, "a.txt", b"x"),
        _upload(alice, session_id, "archive.zip", ZIP_BYTES),
        alice("post", FILES, {"file": "x"}, session_id=session_id),
    ]
    with override_settings(OMNIGENT_MAX_UPLOAD_BYTES=4):
        statuses.append(_upload(alice, session_id, "big.txt", b"too long"))
    assert [r.status_code for r in statuses] == [201, 400, 401, 403, 404, 415, 415, 413]
    statuses = [
        alice("get", FILES, session_id=session_id),
        alice("get", FILES, query="?limit=0", session_id=session_id),
        anon("get", FILES, session_id=session_id),
        alice("get", FILES, session_id=stranger),
        bob("get", FILE, session_id=session_id, file_id=file_id),
        anon("get", FILE, session_id=session_id, file_id=file_id),
        alice("get", FILE, session_id=session_id, file_id="file_nope"),
    ]
    assert [r.status_code for r in statuses] == [200, 400, 401, 404, 200, 401, 404]
    download = bob("get", CONTENT, session_id=session_id, file_id=file_id)
    statuses = [
        download,
        bob(
            "get",
            CONTENT,
            headers={"HTTP_IF_NONE_MATCH": download["ETag"]},
            session_id=session_id,
            file_id=file_id,
        ),
        anon("get", CONTENT, session_id=session_id, file_id=file_id),
        alice("get", CONTENT, session_id=session_id, file_id="file_nope"),
        bob("delete", FILE, session_id=session_id, file_id=file_id),
        anon("delete", FILE, session_id=session_id, file_id=file_id),
        alice("delete", FILE, session_id=session_id, file_id=file_id),
        alice("delete", FILE, session_id=session_id, file_id=file_id),
    ]
    assert [r.status_code for r in statuses] == [200, 304, 401, 404, 403, 401, 200, 404]


def exercise_fork(alice: Any, anon: Any, session_id: str) -> None:
    statuses = [
        alice("post", FORK, {"title": "copy"}, session_id=session_id),
        alice("post", FORK, {"up_to_response_id": "resp_unknown"}, session_id=session_id),
        anon("post", FORK, {}, session_id=session_id),
        alice("post", FORK, {}, session_id="conv_nobody"),
        alice("post", FORK, "x", content_type="text/plain", session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [201, 400, 401, 404, 415]
