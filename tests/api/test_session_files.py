"""Session files (files.md §1): every status of the five endpoints, storage and blocks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from runners import runner_events
from sessions.models import FileBlob, Item, SessionEvent, SessionFile, Turn

from .conftest import ALICE, BOB, CAROL, assert_error
from .files_helpers import FILES, PDF_BYTES, ZIP_BYTES, multipart, png_bytes, post_file

pytestmark = pytest.mark.django_db

Client = Callable[[str | None], APIClient]


def blob_files() -> list[Path]:
    root = Path(settings.DATA_DIR) / "files"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def upload_ok(client: APIClient, session_id: str, name: str, data: bytes) -> dict[str, Any]:
    response = post_file(client, session_id, name, data)
    assert response.status_code == 201, response.content
    return response.json()


# --- upload -----------------------------------------------------------------------------


def test_upload_returns_the_file_object_and_stores_the_bytes_once(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    data = b"line one\nline two\n"
    body = upload_ok(client_for(ALICE), session_id, "notes.md", data)
    sha = hashlib.sha256(data).hexdigest()
    assert body["id"].startswith("file_")
    assert {k: v for k, v in body.items() if k not in ("id", "metadata")} == {
        "object": "session.resource",
        "type": "file",
        "session_id": session_id,
        "name": "notes.md",
    }
    meta = body["metadata"]
    assert meta["filename"] == "notes.md" and meta["bytes"] == len(data)
    assert meta["content_type"] == "text/markdown" and meta["sha256"] == sha
    assert isinstance(meta["created_at"], int)
    stored = blob_files()
    assert [p.name for p in stored] == [sha] and stored[0].read_bytes() == data
    event = SessionEvent.objects.get(session_id=session_id, type="session.resource.created")
    assert event.payload == {
        "type": "session.resource.created",
        "session_id": session_id,
        "resource": body,
    }


def test_the_type_comes_from_the_bytes_not_the_header(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    # The multipart part says application/octet-stream; the bytes decide.
    assert upload_ok(alice, session_id, "shot", png_bytes())["metadata"]["content_type"] == (
        "image/png"
    )
    assert (
        upload_ok(alice, session_id, "doc.bin.pdf", PDF_BYTES)["metadata"]["content_type"]
        == "application/pdf"
    )
    assert (
        upload_ok(alice, session_id, "data.json", b'{"a": 1}')["metadata"]["content_type"]
        == "application/json"
    )
    assert (
        upload_ok(alice, session_id, "rows.jsonl", b"{}\n{}\n")["metadata"]["content_type"]
        == "application/jsonl"
    )
    assert (
        upload_ok(alice, session_id, "log", "héllo".encode())["metadata"]["content_type"]
        == "text/plain"
    )


@pytest.mark.parametrize(
    ("name", "data", "mentions"),
    [
        ("archive.zip", ZIP_BYTES, "application/zip"),
        ("fake.png", b"not a png at all", "image/png"),
        ("latin1.txt", "café".encode("latin-1"), "UTF-8"),
        ("nul.txt", b"abc\x00def", "UTF-8"),
    ],
)
def test_other_types_are_415_and_leave_nothing(
    client_for: Client, create_session: Callable[..., str], name: str, data: bytes, mentions: str
) -> None:
    session_id = create_session()
    response = post_file(client_for(ALICE), session_id, name, data)
    assert_error(response, 415, "unsupported_media_type", mentions=mentions)
    assert SessionFile.objects.count() == 0 and FileBlob.objects.count() == 0
    assert blob_files() == []


@pytest.mark.parametrize(
    "name",
    ["../etc/passwd", "dir/file.txt", "dir\\file.txt", "nul\x00.txt", "é" * 128 + ".txt"],
)
def test_hostile_file_names_are_400_and_leave_nothing(
    client_for: Client, create_session: Callable[..., str], name: str
) -> None:
    session_id = create_session()
    response = post_file(client_for(ALICE), session_id, name, b"hello")
    print("RESP", response.status_code, response.content)
    assert_error(response, 400, "invalid_input")
    assert SessionFile.objects.count() == 0 and blob_files() == []


def test_a_name_of_exactly_255_bytes_is_accepted(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    name = "é" * 125 + "x.txt"  # 250 + 5 bytes
    assert len(name.encode()) == 255
    assert upload_ok(client_for(ALICE), session_id, name, b"ok")["name"] == name


def test_missing_empty_or_extra_parts_are_400(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    path = FILES.format(session_id=session_id)
    cases = [
        multipart([("other", "a.txt", b"x")]),
        multipart([("file", None, b"just a field")]),
        multipart([("file", "", b"x")]),
        multipart([("file", "a.txt", b"x"), ("note", None, b"hi")]),
        multipart([("file", "a.txt", b"x"), ("file", "b.txt", b"y")]),
    ]
    for body, content_type in cases:
        assert_error(
            alice.generic("POST", path, body, content_type=content_type), 400, "invalid_input"
        )
    assert SessionFile.objects.count() == 0 and blob_files() == []


def test_not_multipart_is_415(client_for: Client, create_session: Callable[..., str]) -> None:
    session_id = create_session()
    response = client_for(ALICE).post(
        FILES.format(session_id=session_id), {"file": "x"}, format="json"
    )
    assert_error(response, 415, "unsupported_media_type")


def test_over_the_cap_is_413_with_no_row_and_no_partial_file(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    with override_settings(OMNIGENT_MAX_UPLOAD_BYTES=1000):
        ok = post_file(client_for(ALICE), session_id, "a.txt", b"a" * 1000)
        assert ok.status_code == 201
        # Within the framing slack: the streaming handler stops it at byte 1001.
        over = post_file(client_for(ALICE), session_id, "b.txt", b"b" * 1001)
        assert_error(over, 413, "payload_too_large")
        # Far over: refused from Content-Length before a byte is stored.
        with override_settings(OMNIGENT_UPLOAD_OVERHEAD_BYTES=0):
            far = post_file(client_for(ALICE), session_id, "c.txt", b"c" * 5000)
        assert_error(far, 413, "payload_too_large")
    assert SessionFile.objects.count() == 1
    assert [p.name for p in blob_files()] == [hashlib.sha256(b"a" * 1000).hexdigest()]


def test_permissions_on_upload(
    client_for: Client, create_session: Callable[..., str], grant: Any
) -> None:
    session_id = create_session()
    grant(session_id, BOB, 1)
    assert_error(post_file(client_for(BOB), session_id, "a.txt", b"x"), 403, "forbidden")
    assert_error(post_file(client_for(CAROL), session_id, "a.txt", b"x"), 404, "not_found")
    assert_error(post_file(client_for(None), session_id, "a.txt", b"x"), 401, "unauthorized")
    grant(session_id, BOB, 2)
    assert post_file(client_for(BOB), session_id, "a.txt", b"x").status_code == 201
    assert blob_files() != []


# --- list, read, download ---------------------------------------------------------------


def test_list_is_newest_first_with_cursor_params(
    client_for: Client, create_session: Callable[..., str], grant: Any
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    ids = [upload_ok(alice, session_id, f"f{i}.txt", f"{i}".encode())["id"] for i in range(3)]
    grant(session_id, BOB, 1)
    path = FILES.format(session_id=session_id)
    listed = client_for(BOB).get(path).json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == ids[::-1]
    assert listed["first_id"] == ids[2] and listed["last_id"] == ids[0]
    page = alice.get(path, {"limit": 1, "order": "asc"}).json()
    assert [f["id"] for f in page["data"]] == ids[:1] and page["has_more"] is True
    rest = alice.get(path, {"order": "asc", "after": ids[0]}).json()
    assert [f["id"] for f in rest["data"]] == ids[1:] and rest["has_more"] is False
    assert_error(alice.get(path, {"limit": 0}), 400, "invalid_input")
    assert_error(client_for(CAROL).get(path), 404, "not_found")
    assert_error(client_for(None).get(path), 401, "unauthorized")


def test_get_one_and_unknown(client_for: Client, create_session: Callable[..., str]) -> None:
    session_id = create_session()
    other = create_session()
    alice = client_for(ALICE)
    body = upload_ok(alice, session_id, "a.txt", b"x")
    path = FILES.format(session_id=session_id) + "/" + body["id"]
    assert alice.get(path).json() == body
    assert_error(alice.get(FILES.format(session_id=session_id) + "/file_nope"), 404, "not_found")
    # Another session's file id is not found through this session.
    assert_error(alice.get(FILES.format(session_id=other) + "/" + body["id"]), 404, "not_found")


def test_download_headers_etag_and_304(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    data = "première ligne\n".encode()
    body = upload_ok(alice, session_id, 'rapport été "v2".txt', data)
    path = FILES.format(session_id=session_id) + "/" + body["id"] + "/content"
    response = alice.get(path)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["ETag"] == f'"{body["metadata"]["sha256"]}"'
    assert response["Content-Length"] == str(len(data))
    assert response["Content-Disposition"] == (
        'attachment; filename="rapport _t_ _v2_.txt"; '
        "filename*=UTF-8''rapport%20%C3%A9t%C3%A9%20%22v2%22.txt"
    )
    not_modified = alice.get(path, headers={"If-None-Match": response["ETag"]})
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified["ETag"] == response["ETag"]
    assert alice.get(path, headers={"If-None-Match": '"other"'}).status_code == 200
    assert (
        alice.get(path, headers={"If-None-Match": f'"x", W/{response["ETag"]}'}).status_code == 304
    )
    image = upload_ok(alice, session_id, "p.png", png_bytes())
    png = alice.get(FILES.format(session_id=session_id) + "/" + image["id"] + "/content")
    assert png["Content-Type"] == "image/png"
    assert b"".join(png.streaming_content) == png_bytes()
    assert_error(
        alice.get(FILES.format(session_id=session_id) + "/file_x/content"), 404, "not_found"
    )
    assert_error(client_for(CAROL).get(path), 404, "not_found")


ACTIVE_CONTENT = [
    ("page.html", b"<html><script>alert(document.cookie)</script></html>"),
    ("page.htm", b"<script>alert(1)</script>"),
    ("page.shtml", b"<script>alert(1)</script>"),
    ("app.js", b"alert(1)"),
    ("app.mjs", b"export default 1"),
    ("style.css", b"body { color: red }"),
]
# Text a browser runs script in when served as its own type; stored as ``text/plain`` or
# an XML type depending on the machine's MIME table, never served as one that runs.
MARKUP = [
    ("image.svg", b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>'),
    ("page.xhtml", b'<html xmlns="http://www.w3.org/1999/xhtml"><script>alert(1)</script></html>'),
    ("data.xml", b'<?xml version="1.0"?><x:script xmlns:x="http://www.w3.org/1999/xhtml"/>'),
    ("style.xsl", b'<xsl:stylesheet version="1.0"/>'),
]


def download(client: APIClient, session_id: str, name: str, data: bytes) -> Any:
    body = upload_ok(client, session_id, name, data)
    response = client.get(FILES.format(session_id=session_id) + "/" + body["id"] + "/content")
    assert response.status_code == 200
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"].startswith("attachment;")
    assert b"".join(response.streaming_content) == data
    return response


@pytest.mark.parametrize(("name", "data"), ACTIVE_CONTENT)
def test_active_content_is_downloaded_as_bytes(
    client_for: Client, create_session: Callable[..., str], name: str, data: bytes
) -> None:
    """A page, a script or a style sheet served with its own type from this origin would
    run as the app's: downloads keep their type only when it is passive."""
    response = download(client_for(ALICE), create_session(), name, data)
    assert response["Content-Type"] == "application/octet-stream"


@pytest.mark.parametrize(("name", "data"), MARKUP)
def test_markup_is_never_served_as_markup(
    client_for: Client, create_session: Callable[..., str], name: str, data: bytes
) -> None:
    response = download(client_for(ALICE), create_session(), name, data)
    assert response["Content-Type"] in ("application/octet-stream", "text/plain; charset=utf-8")


@pytest.mark.parametrize(
    ("name", "data", "served"),
    [
        ("notes.txt", b"plain", "text/plain; charset=utf-8"),
        ("notes.md", b"# title", "text/markdown; charset=utf-8"),
        ("table.csv", b"a,b\n", "text/csv; charset=utf-8"),
        ("data.json", b'{"a": 1}', "application/json; charset=utf-8"),
        ("rows.jsonl", b"{}\n", "application/jsonl; charset=utf-8"),
        ("doc.pdf", PDF_BYTES, "application/pdf"),
        ("p.png", png_bytes(), "image/png"),
    ],
)
def test_passive_content_keeps_its_type(
    client_for: Client, create_session: Callable[..., str], name: str, data: bytes, served: str
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    body = upload_ok(alice, session_id, name, data)
    response = alice.get(FILES.format(session_id=session_id) + "/" + body["id"] + "/content")
    assert response["Content-Type"] == served
    assert response["X-Content-Type-Options"] == "nosniff"


# --- delete and reference counting ------------------------------------------------------


def test_delete_and_refcount(
    client_for: Client, create_session: Callable[..., str], grant: Any
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    first = upload_ok(alice, session_id, "a.txt", b"same bytes")
    second = upload_ok(alice, session_id, "b.txt", b"same bytes")
    assert len(blob_files()) == 1 and FileBlob.objects.count() == 1
    grant(session_id, BOB, 1)
    base = FILES.format(session_id=session_id)
    assert_error(client_for(BOB).delete(f"{base}/{first['id']}"), 403, "forbidden")
    response = alice.delete(f"{base}/{first['id']}")
    assert response.status_code == 200
    assert response.json() == {
        "id": first["id"],
        "object": "session.resource.deleted",
        "deleted": True,
    }
    assert len(blob_files()) == 1, "still used by the second file"
    assert_error(alice.delete(f"{base}/{first['id']}"), 404, "not_found")
    assert_error(alice.get(f"{base}/{first['id']}"), 404, "not_found")
    alice.delete(f"{base}/{second['id']}")
    assert blob_files() == [] and FileBlob.objects.count() == 0
    event = SessionEvent.objects.filter(type="session.resource.deleted").order_by("seq").first()
    assert event is not None and event.payload == {
        "type": "session.resource.deleted",
        "session_id": session_id,
        "resource_id": first["id"],
        "resource_type": "file",
    }


def test_deleting_the_session_removes_bytes_no_one_else_uses(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    one, two = create_session(), create_session()
    alice = client_for(ALICE)
    upload_ok(alice, one, "shared.txt", b"shared")
    upload_ok(alice, one, "own.txt", b"only in one")
    upload_ok(alice, two, "shared.txt", b"shared")
    assert alice.delete(f"/v1/sessions/{one}").status_code == 200
    assert [p.name for p in blob_files()] == [hashlib.sha256(b"shared").hexdigest()]
    assert alice.delete(f"/v1/sessions/{two}").status_code == 200
    assert blob_files() == [] and FileBlob.objects.count() == 0


# --- message blocks ---------------------------------------------------------------------


def post_message(client: APIClient, session_id: str, content: list[dict[str, Any]]) -> Any:
    return client.post(
        f"/v1/sessions/{session_id}/events",
        {"type": "message", "data": {"role": "user", "content": content}},
        format="json",
    )


def test_blocks_pointing_elsewhere_are_400_and_store_nothing(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id, other = create_session(), create_session()
    alice = client_for(ALICE)
    text = upload_ok(alice, session_id, "a.txt", b"hello")
    foreign = upload_ok(alice, other, "b.txt", b"elsewhere")
    gone = upload_ok(alice, session_id, "c.txt", b"deleted soon")
    alice.delete(FILES.format(session_id=session_id) + "/" + gone["id"])
    bad_blocks = [
        {"type": "input_file", "file_id": foreign["id"]},
        {"type": "input_file", "file_id": gone["id"]},
        {"type": "input_file", "file_id": "file_unknown"},
        {"type": "input_file"},
        {"type": "input_file", "file_id": 5},
        {"type": "input_image", "file_id": text["id"]},
        {"type": "input_file", "file_id": text["id"], "filename": 3},
    ]
    for block in bad_blocks:
        response = post_message(alice, session_id, [{"type": "input_text", "text": "x"}, block])
        print("RESP", response.status_code, response.content)
    assert_error(response, 400, "invalid_input")
    assert Item.objects.filter(session_id=session_id).count() == 0
    assert Turn.objects.filter(session_id=session_id).count() == 0


def test_turn_input_over_a_frame_is_413(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    big = upload_ok(alice, session_id, "big.txt", b"x" * 30_000)
    with override_settings(OMNIGENT_MAX_FRAME_BYTES=32_000):
        response = post_message(alice, session_id, [{"type": "input_file", "file_id": big["id"]}])
    assert_error(response, 413, "payload_too_large", mentions="frame")
    assert Item.objects.filter(session_id=session_id).count() == 0


def test_valid_blocks_then_need_a_runner(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    image = upload_ok(alice, session_id, "p.png", png_bytes())
    response = post_message(alice, session_id, [{"type": "input_image", "file_id": image["id"]}])
    assert_error(response, 503, "runner_unavailable")
    assert Item.objects.filter(session_id=session_id).count() == 0


def test_turn_start_carries_the_bytes_and_the_stored_item_only_the_id(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    text = upload_ok(alice, session_id, "a.txt", b"hello file")
    image = upload_ok(alice, session_id, "p.png", png_bytes())
    data = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_file", "file_id": text["id"]},
            {"type": "input_image", "file_id": image["id"], "filename": "shot.png"},
        ],
    }
    from sessions import files

    prepared = files.prepare_message_files(session_id=session_id, data=data)
    assert prepared["content"][1] == {
        "type": "input_file",
        "file_id": text["id"],
        "filename": "a.txt",
    }
    item, turn = runner_events.accept_message(
        session_id=session_id, created_by=ALICE, data=prepared, tools=[]
    )
    stored = Item.objects.get(pk=item.pk).data["content"]
    assert "file_data" not in json.dumps(stored) and stored[1]["file_id"] == text["id"]
    command = runner_events.turn_start_command(response=turn)
    content = command.input[0]["content"]
    assert content[1]["file_data"] == "data:text/plain;base64,aGVsbG8gZmlsZQ=="
    assert content[1]["filename"] == "a.txt"
    assert content[2]["image_url"].startswith("data:image/png;base64,")
    assert content[2]["filename"] == "shot.png"


def test_a_failed_write_leaves_no_row_and_no_bytes(
    create_session: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row insert (or anything after the bytes were placed) fails: all undone."""
    from omnigent_site.users import get_or_create_user
    from sessions import file_store, files
    from sessions.models import Session

    session = Session.objects.get(pk=create_session())

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("database went away")

    monkeypatch.setattr(files, "record_event", broken)
    writer = file_store.BlobWriter(limit=1000)
    writer.write(b"doomed bytes")
    with pytest.raises(RuntimeError):
        files.add_session_file(
            session=session, user=get_or_create_user(ALICE), name="a.txt", writer=writer
        )
    assert SessionFile.objects.count() == 0 and FileBlob.objects.count() == 0
    assert blob_files() == []


def test_download_takes_any_accept_header(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    session_id = create_session()
    alice = client_for(ALICE)
    body = upload_ok(alice, session_id, "a.txt", b"bytes")
    path = FILES.format(session_id=session_id) + "/" + body["id"] + "/content"
    for accept in ("application/octet-stream", "text/html", "image/png"):
        response = alice.get(path, HTTP_ACCEPT=accept)
        assert response.status_code == 200, accept
        assert b"".join(response.streaming_content) == b"bytes"
    missing = alice.get(
        FILES.format(session_id=session_id) + "/file_x/content", HTTP_ACCEPT="image/png"
    )
    assert_error(missing, 404, "not_found")


# --- the web page's path: a login session, whose CSRF check parses the body first --------


@pytest.fixture
def signed_in_owner(create_session: Callable[..., str]) -> tuple[Any, str]:
    """A browser signed in as a Django user (CSRF enforced) and a session of theirs."""
    from django.contrib.auth import get_user_model
    from django.test import Client as BrowserClient

    session_id = create_session("dana")
    user = get_user_model().objects.get(username="dana")
    user.set_password("pw-dana-1")
    user.save()
    browser = BrowserClient(enforce_csrf_checks=True)
    assert browser.login(username="dana", password="pw-dana-1")
    browser.get("/")  # the page sets the CSRF cookie
    return browser, session_id


def post_file_signed_in(browser: Any, session_id: str, name: str, data: bytes) -> Any:
    """As the web page sends it: multipart, the CSRF token in ``X-CSRFToken``."""
    body, content_type = multipart([("file", name, data)])
    return browser.generic(
        "POST",
        FILES.format(session_id=session_id),
        body,
        content_type=content_type,
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )


@pytest.mark.parametrize(
    "name",
    ["a/b.txt", "../x.txt", "..\\x.txt", "/etc/passwd", "nul\x00.txt", "é" * 128 + ".txt"],
)
def test_the_cookie_path_refuses_the_names_the_api_path_refuses(
    signed_in_owner: tuple[Any, str], client_for: Client, name: str
) -> None:
    browser, session_id = signed_in_owner
    assert_error(post_file_signed_in(browser, session_id, name, b"hello"), 400, "invalid_input")
    assert_error(post_file(client_for("dana"), session_id, name, b"hello"), 400, "invalid_input")
    assert SessionFile.objects.count() == 0 and blob_files() == []


@pytest.mark.parametrize("name", ["notes.txt", "a &amp; b.txt", "tab\there.txt"])
def test_the_cookie_path_keeps_a_name_as_sent(
    signed_in_owner: tuple[Any, str], client_for: Client, name: str
) -> None:
    """The same name is stored whichever path it came by (Django's parser would unescape
    HTML entities and drop characters that do not print)."""
    browser, session_id = signed_in_owner
    response = post_file_signed_in(browser, session_id, name, b"hello")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == name
    assert upload_ok(client_for("dana"), session_id, name, b"hello")["name"] == name
    assert post_file_signed_in(browser, session_id, name, b"x").status_code == 201


def test_the_cookie_path_still_needs_the_csrf_token(signed_in_owner: tuple[Any, str]) -> None:
    browser, session_id = signed_in_owner
    body, content_type = multipart([("file", "notes.txt", b"hello")])
    response = browser.generic(
        "POST", FILES.format(session_id=session_id), body, content_type=content_type
    )
    assert_error(response, 403, "forbidden")
    assert SessionFile.objects.count() == 0 and blob_files() == []
