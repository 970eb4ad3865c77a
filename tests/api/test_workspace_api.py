"""The workspace through the server (files.md §2): every status code of the endpoints.

The relay is replaced by ``workspace_fakes.FakeWorkspaceRunner``, which runs the runner's
own workspace code on a temporary folder, so the confinement and statuses are the real
ones end to end through the HTTP layer; the tunnel itself is covered in
``tests/consumers/test_workspace_relay.py`` and ``tests/e2e/test_workspace_e2e.py``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from omnigent_runner import protocol
from omnigent_site.users import get_or_create_user
from runners import workspace_relay
from runners.models import Runner
from runners.relay import RelayError
from sessions.models import Session
from workspaces.models import FileChange
from workspaces.services import apply_workspace_changes

from .conftest import ALICE, BOB, CAROL, assert_error
from .workspace_fakes import FakeWorkspaceRunner, relaying_to

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "a.txt").write_text("alpha\nbeta\n")
    return ws


@pytest.fixture
def fake(root: Path) -> Iterator[FakeWorkspaceRunner]:
    with relaying_to(FakeWorkspaceRunner(root)) as runner:
        yield runner


def make_runner(runner_id: str = "runner_token_ws", *, online: bool = True) -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id=runner_id,
        owner=get_or_create_user(ALICE),
        channel_name="specific.ws!1" if online else "",
        connected_at=now if online else None,
        last_seen_at=now if online else None,
    )


@pytest.fixture
def session_id(create_session: Callable[..., str], grant: Any) -> str:
    sid = create_session()
    Session.objects.filter(pk=sid).update(runner=make_runner())
    grant(sid, BOB, 1)  # read
    grant(sid, CAROL, 2)  # edit
    return sid


@pytest.fixture
def alice(client_for: Callable[[str | None], APIClient]) -> APIClient:
    return client_for(ALICE)


def url(session_id: str, rest: str = "filesystem", env: str = "default") -> str:
    return f"/v1/sessions/{session_id}/resources/environments/{env}/{rest}"


def put(client: APIClient, session_id: str, path: str, **body: Any) -> Any:
    return client.put(url(session_id, f"filesystem/{path}"), body, format="json")


def patch(client: APIClient, session_id: str, path: str, **body: Any) -> Any:
    return client.patch(url(session_id, f"filesystem/{path}"), body, format="json")


# --- reads ----------------------------------------------------------------------------


def test_browse_read_and_page(alice: APIClient, session_id: str, fake: Any, root: Path) -> None:
    for name in ("b.txt", "a.txt"):
        (root / name).write_text(name)
    (root / "img.bin").write_bytes(b"\x89PNG\x00")
    listing = alice.get(url(session_id), {"limit": 2})
    assert listing.status_code == 200
    body = listing.json()
    assert [e["name"] for e in body["data"]] == ["docs", "a.txt"]
    assert (body["has_more"], body["last_id"], body["object"]) == (True, "a.txt", "list")
    rest = alice.get(url(session_id), {"after": "a.txt"}).json()
    assert [e["name"] for e in rest["data"]] == ["b.txt", "img.bin"] and not rest["has_more"]
    file = alice.get(url(session_id, "filesystem/docs/a.txt")).json()
    assert (file["object"], file["encoding"], file["content"], file["truncated"]) == (
        "session.environment.filesystem.file",
        "utf-8",
        "alpha\nbeta\n",
        False,
    )
    binary = alice.get(url(session_id, "filesystem/img.bin")).json()
    assert binary["encoding"] == "base64" and base64.b64decode(binary["content"]) == b"\x89PNG\x00"
    with override_settings(OMNIGENT_WORKSPACE_READ_MAX_BYTES=5):
        cut = alice.get(url(session_id, "filesystem/docs/a.txt")).json()
    assert (cut["content"], cut["truncated"], cut["bytes"]) == ("alpha", True, 11)
    sub = alice.get(url(session_id, "filesystem/docs")).json()
    assert [e["path"] for e in sub["data"]] == ["docs/a.txt"]


def test_download_streams_the_whole_file_in_chunks(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner, root: Path
) -> None:
    data = bytes(range(256)) * 1000  # 256,000 bytes
    (root / "big.bin").write_bytes(data)
    # A frame limit of 100 KiB makes every chunk 27 KiB: ten read_chunk calls, each
    # answer (base64 plus envelope) well inside one frame.
    with override_settings(OMNIGENT_MAX_FRAME_BYTES=100 * 1024):
        size = workspace_relay.chunk_bytes()
        response = alice.get(url(session_id, "filesystem/big.bin"), {"download": "1"})
        assert response.status_code == 200 and response.streaming
        body = async_to_sync(_collect)(response)
    assert body == data
    assert response["Content-Length"] == str(len(data))
    assert response["Content-Disposition"] == 'attachment; filename="big.bin"'
    assert response["X-Content-Type-Options"] == "nosniff"
    chunks = [c for c in fake.commands if isinstance(c, protocol.Rpc)]
    assert size * 4 // 3 + 1024 < 100 * 1024
    assert len(chunks) == -(-len(data) // size) == 10
    assert {c.method for c in chunks} == {"workspace.read_chunk"}
    assert all(c.params["length"] == size for c in chunks)
    folder = alice.get(url(session_id, "filesystem/docs"), {"download": "1"})
    assert_error(folder, 400, "invalid_input", mentions="not a file")
    # A client that accepts only bytes gets them, and its errors still as JSON.
    bytes_only = {"HTTP_ACCEPT": "application/octet-stream"}
    small = alice.get(url(session_id, "filesystem/docs/a.txt"), {"download": "1"}, **bytes_only)
    assert small.status_code == 200 and async_to_sync(_collect)(small) == b"alpha\nbeta\n"
    missing = alice.get(url(session_id, "filesystem/nope.bin"), {"download": "1"}, **bytes_only)
    assert_error(missing, 404, "not_found")


def test_a_workspace_page_is_never_served_as_a_page(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner, root: Path
) -> None:
    """An HTML file of the workspace comes back as bytes (a download) or inside JSON (a
    read, escaped on the browsable API's page): never as ``text/html`` of its own."""
    page = b"<html><script>alert(document.cookie)</script></html>"
    (root / "page.html").write_bytes(page)
    download = alice.get(url(session_id, "filesystem/page.html"), {"download": "1"})
    assert download["Content-Type"] == "application/octet-stream"
    assert download["X-Content-Type-Options"] == "nosniff"
    assert async_to_sync(_collect)(download) == page
    read = alice.get(url(session_id, "filesystem/page.html"), HTTP_ACCEPT="text/html")
    assert read.status_code == 200
    assert b"<script>alert" not in read.content


async def _collect(response: Any) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def test_read_errors(alice: APIClient, session_id: str, fake: Any) -> None:
    assert_error(alice.get(url(session_id, "filesystem/nope.txt")), 404, "not_found")
    assert_error(alice.get(url(session_id, env="scratch")), 404, "not_found")
    assert_error(alice.get(url(session_id), {"limit": "1001"}), 400, "invalid_input")
    assert_error(alice.get(url(session_id), {"limit": "x"}), 400, "invalid_input")
    assert_error(
        alice.get(url(session_id, "filesystem/x"), {"download": "maybe"}), 400, "invalid_input"
    )


# --- hostile paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "a/../../etc/passwd", "..", "a%00b", "..%5Cx", "C:/Windows"]
)
def test_path_tricks_are_400_everywhere(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner, path: str
) -> None:
    target = url(session_id, f"filesystem/{path}")
    for response in (
        alice.get(target),
        alice.put(target, {"content": "x"}, format="json"),
        alice.patch(target, {"old_text": "a", "new_text": "b"}, format="json"),
        alice.delete(target),
    ):
        assert_error(response, 400, "invalid_input")


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("n" * 300 + ".txt", "255 bytes per name"),
        ("sub/" + "é" * 128, "255 bytes per name"),
        ("a" * 5000, "4096 bytes"),
        ("/".join(["d" * 100] * 45), "4096 bytes"),
    ],
)
def test_names_and_paths_over_the_limits_are_400_before_the_runner_is_asked(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner, path: str, limit: str
) -> None:
    """The runner's file system answered ``[Errno 36] File name too long: '<its absolute
    path>'`` as a 503. The server knows the limits and answers without relaying."""
    target = url(session_id, f"filesystem/{path}")
    for response in (
        alice.get(target),
        alice.get(target, {"download": "1"}),
        alice.put(target, {"content": "x", "create_parents": True}, format="json"),
        alice.patch(target, {"old_text": "a", "new_text": "b"}, format="json"),
        alice.delete(target, QUERY_STRING="recursive=true"),
        alice.get(url(session_id, "search"), {"q": "x", "path": path}),
    ):
        error = assert_error(response, 400, "invalid_input", mentions=limit)
        assert error["fields"] == {"path": [error["message"].removeprefix("path: ")]}
    assert not [command for command in fake.commands if isinstance(command, protocol.Rpc)]


def test_symlink_escapes_and_git_writes_are_refused(
    alice: APIClient, session_id: str, fake: Any, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "escape").symlink_to(outside)
    (root / "secret.txt").symlink_to(outside / "secret.txt")
    (root / ".git").mkdir()
    for response in (
        alice.get(url(session_id, "filesystem/escape")),
        alice.get(url(session_id, "filesystem/secret.txt")),
        alice.get(url(session_id, "filesystem/escape/secret.txt"), {"download": "1"}),
        put(alice, session_id, "escape/new.txt", content="x"),
        patch(alice, session_id, "secret.txt", old_text="secret", new_text="x"),
        alice.delete(url(session_id, "filesystem/escape/secret.txt")),
        alice.get(url(session_id, "search"), {"q": "secret", "path": "escape"}),
    ):
        assert_error(response, 400, "invalid_input", mentions="outside the workspace root")
    assert (outside / "secret.txt").read_text() == "secret" and not (outside / "new.txt").exists()
    assert_error(put(alice, session_id, ".git/config", content="x"), 403, "forbidden")
    assert_error(alice.delete(url(session_id, "filesystem/.git")), 403, "forbidden")
    assert alice.get(url(session_id, "search"), {"q": "secret"}).json()["data"] == []


# --- writes ---------------------------------------------------------------------------


def test_put_patch_delete(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner, root: Path
) -> None:
    created = put(alice, session_id, "docs/new.txt", content="one one\n")
    assert created.status_code == 200
    assert created.json()["path"] == "docs/new.txt" and created.json()["bytes"] == 8
    assert (root / "docs/new.txt").read_text() == "one one\n"
    assert_error(put(alice, session_id, "deep/x.txt", content="x"), 409, "conflict")
    deep = put(
        alice, session_id, "deep/x.bin", content="AAE=", encoding="base64", create_parents=True
    )
    assert deep.status_code == 200 and (root / "deep/x.bin").read_bytes() == b"\x00\x01"
    assert_error(put(alice, session_id, "docs", content="x"), 409, "conflict")
    assert_error(put(alice, session_id, "x", content=5), 400, "invalid_input")
    assert_error(put(alice, session_id, "x", content="x", encoding="latin-1"), 400, "invalid_input")
    assert_error(put(alice, session_id, "x", content="!!", encoding="base64"), 400, "invalid_input")
    assert_error(
        put(alice, session_id, "x", content="x", create_parents="yes"), 400, "invalid_input"
    )
    # Types are checked, not coerced (http-api.md, Input strictness).
    for wrong in ({"encoding": 5}, {"encoding": ["utf-8"]}, {"create_parents": 1}):
        response = put(alice, session_id, "x", content="x", **wrong)
        assert_error(response, 400, "invalid_input")
        assert set(response.json()["error"]["fields"]) == set(wrong)
    for wrong in ({"replace_all": "true"}, {"old_text": 1}, {"new_text": None}):
        response = patch(
            alice, session_id, "docs/new.txt", **{"old_text": "a", "new_text": "b", **wrong}
        )
        assert_error(response, 400, "invalid_input")
        assert set(response.json()["error"]["fields"]) == set(wrong)
    with override_settings(OMNIGENT_WORKSPACE_WRITE_MAX_BYTES=4):
        assert_error(put(alice, session_id, "x", content="12345"), 413, "payload_too_large")
        assert_error(
            put(alice, session_id, "x", content="AAAAAAAA", encoding="base64"),
            413,
            "payload_too_large",
        )
    assert not (root / "x").exists()

    assert_error(
        patch(alice, session_id, "docs/new.txt", old_text="one", new_text="1"),
        400,
        "invalid_input",
        mentions="matched 2 times",
    )
    assert_error(
        patch(alice, session_id, "docs/new.txt", old_text="two", new_text="2"),
        400,
        "invalid_input",
        mentions="matched 0 times",
    )
    assert_error(
        patch(alice, session_id, "docs/new.txt", old_text="", new_text="2"), 400, "invalid_input"
    )
    assert_error(patch(alice, session_id, "nope.txt", old_text="a", new_text="b"), 404, "not_found")
    edited = patch(
        alice, session_id, "docs/new.txt", old_text="one", new_text="1", replace_all=True
    )
    assert edited.status_code == 200 and (root / "docs/new.txt").read_text() == "1 1\n"

    assert_error(alice.delete(url(session_id, "filesystem/docs")), 409, "conflict")
    assert alice.delete(url(session_id, "filesystem/docs/new.txt")).status_code == 204
    assert_error(alice.delete(url(session_id, "filesystem/docs/new.txt")), 404, "not_found")
    assert (
        alice.delete(url(session_id, "filesystem/docs"), QUERY_STRING="recursive=true").status_code
        == 204
    )
    assert not (root / "docs").exists()


def test_writes_enter_the_change_set_as_the_users(
    alice: APIClient, session_id: str, fake: FakeWorkspaceRunner
) -> None:
    put(alice, session_id, "docs/new.txt", content="hi\n")
    patch(alice, session_id, "docs/a.txt", old_text="beta", new_text="gamma")
    assert [(e["path"], e["status"], e["attribution"]) for e in fake.changes] == [
        ("docs/new.txt", "created", "user"),
        ("docs/a.txt", "modified", "user"),
    ]
    # What the server stores from those events (runner_events.record → this service).
    session = Session.objects.get(pk=session_id)
    for _, event in fake.events:
        assert isinstance(event, protocol.WorkspaceChanges)
        apply_workspace_changes(session=session, payload=protocol.to_builtins(event))
    stored = {c.path: (c.status, c.attribution) for c in FileChange.objects.filter(session=session)}
    assert stored == {"docs/new.txt": ("created", "user"), "docs/a.txt": ("modified", "user")}
    # The agent's later edit of the same path takes the attribution back.
    apply_workspace_changes(
        session=session,
        payload={
            "mode": "agent_edit",
            "entries": [{"path": "docs/a.txt", "status": "modified", "attribution": "agent"}],
        },
    )
    assert FileChange.objects.get(session=session, path="docs/a.txt").attribution == "agent"
    # The listing and diffs come from those records, so they answer with the runner offline.
    Runner.objects.filter(pk="runner_token_ws").update(channel_name="")
    changes = alice.get(url(session_id, "changes"))
    assert changes.status_code == 200 and {e["path"] for e in changes.json()["data"]} == set(stored)
    diff = alice.get(url(session_id, "diff/docs/a.txt"))
    assert diff.status_code == 200 and diff.json()["before"] == "alpha\nbeta\n"


# --- search ---------------------------------------------------------------------------


def test_search(alice: APIClient, session_id: str, fake: Any, root: Path) -> None:
    (root / "code.py").write_text("beta = 1\n")
    found = alice.get(url(session_id, "search"), {"q": "beta"}).json()
    assert found == {
        "object": "list",
        "data": [
            {"path": "code.py", "line": 1, "text": "beta = 1"},
            {"path": "docs/a.txt", "line": 2, "text": "beta"},
        ],
        "truncated": False,
    }
    limited = alice.get(url(session_id, "search"), {"q": "beta", "limit": "1"}).json()
    assert len(limited["data"]) == 1 and limited["truncated"] is True
    globbed = alice.get(url(session_id, "search"), {"q": "b.t", "regex": "1", "glob": "*.txt"})
    assert [h["path"] for h in globbed.json()["data"]] == ["docs/a.txt"]
    assert_error(alice.get(url(session_id, "search")), 400, "invalid_input")
    assert_error(
        alice.get(url(session_id, "search"), {"q": "(", "regex": "1"}), 400, "invalid_input"
    )
    assert_error(
        alice.get(url(session_id, "search"), {"q": "x", "limit": "501"}), 400, "invalid_input"
    )
    assert_error(
        alice.get(url(session_id, "search"), {"q": "x", "path": "../x"}), 400, "invalid_input"
    )


# --- who may look ---------------------------------------------------------------------


def test_reads_need_edit_unless_shared_and_writes_always_need_edit(
    client_for: Callable[[str | None], APIClient], session_id: str, fake: Any
) -> None:
    alice, bob, carol = client_for(ALICE), client_for(BOB), client_for(CAROL)
    assert_error(bob.get(url(session_id)), 403, "forbidden", mentions="edit")
    assert_error(bob.get(url(session_id, "search"), {"q": "a"}), 403, "forbidden")
    assert carol.get(url(session_id)).status_code == 200  # edit reads by default
    assert_error(client_for("stranger@example.com").get(url(session_id)), 404, "not_found")
    assert_error(client_for(None).get(url(session_id)), 401, "unauthorized")
    # Sharing needs manage: an editor may not, the owner may.
    session = f"/v1/sessions/{session_id}"
    assert_error(
        carol.patch(session, {"share_workspace_files": True}, format="json"), 403, "forbidden"
    )
    assert_error(
        alice.patch(session, {"share_workspace_files": "yes"}, format="json"), 400, "invalid_input"
    )
    shared = alice.patch(session, {"share_workspace_files": True}, format="json")
    assert shared.status_code == 200 and shared.json()["share_workspace_files"] is True
    assert bob.get(session).json()["share_workspace_files"] is True
    assert bob.get(url(session_id)).status_code == 200
    assert bob.get(url(session_id, "filesystem/docs/a.txt")).status_code == 200
    assert bob.get(url(session_id, "search"), {"q": "a"}).status_code == 200
    assert_error(put(bob, session_id, "x.txt", content="x"), 403, "forbidden")
    assert_error(patch(bob, session_id, "docs/a.txt", old_text="a", new_text="b"), 403, "forbidden")
    assert_error(bob.delete(url(session_id, "filesystem/docs/a.txt")), 403, "forbidden")
    unshared = alice.patch(session, {"share_workspace_files": False}, format="json")
    assert unshared.json()["share_workspace_files"] is False
    assert_error(bob.get(url(session_id)), 403, "forbidden")


# --- the runner not there -------------------------------------------------------------


def test_no_runner_is_409_and_an_offline_or_silent_runner_503(
    alice: APIClient, session_id: str, root: Path
) -> None:
    Session.objects.filter(pk=session_id).update(runner=None)
    with relaying_to(FakeWorkspaceRunner(root)) as fake:
        assert_error(alice.get(url(session_id)), 409, "conflict", mentions="no runner")
        assert_error(put(alice, session_id, "x", content="x"), 409, "conflict")
        Session.objects.filter(pk=session_id).update(
            runner=make_runner("runner_token_off", online=False)
        )
        assert_error(alice.get(url(session_id)), 503, "runner_unavailable", mentions="offline")
        assert_error(alice.get(url(session_id, "search"), {"q": "x"}), 503, "runner_unavailable")
        assert fake.commands == []
    Session.objects.filter(pk=session_id).update(runner="runner_token_ws")
    with relaying_to(FakeWorkspaceRunner(root, offline=True)):
        assert_error(alice.get(url(session_id)), 503, "runner_unavailable")
        assert_error(
            alice.delete(url(session_id, "filesystem/docs/a.txt")), 503, "runner_unavailable"
        )
    assert (root / "docs/a.txt").exists()


def test_the_session_is_opened_on_the_runner_first(
    alice: APIClient, session_id: str, root: Path
) -> None:
    Runner.objects.filter(pk="runner_token_ws").update(generation=3)
    with relaying_to(FakeWorkspaceRunner(root)) as fake:
        assert alice.get(url(session_id)).status_code == 200
    kinds = [protocol.frame_type(c) for c in fake.commands]
    assert kinds == ["session.open", "rpc"]
    rpc = fake.commands[1]
    assert isinstance(rpc, protocol.Rpc) and rpc.params["session_id"] == session_id


def test_a_session_not_open_on_the_runner_is_opened_and_retried(
    alice: APIClient, session_id: str, root: Path
) -> None:
    fake = FakeWorkspaceRunner(root)
    answer = fake.send_command
    refused: list[bool] = []

    async def not_open_once(**kwargs: Any) -> Any:
        command = kwargs["command"]
        if isinstance(command, protocol.Rpc) and not refused:
            refused.append(True)
            fake.commands.append(command)
            raise RelayError("session_not_open", "not open", status=409)
        return await answer(**kwargs)

    fake.send_command = not_open_once  # type: ignore[method-assign]
    with relaying_to(fake):
        response = alice.get(url(session_id))
    assert response.status_code == 200, response.content
    assert [protocol.frame_type(c) for c in fake.commands] == ["rpc", "session.open", "rpc"]


def test_a_malformed_runner_answer_is_503(alice: APIClient, session_id: str, root: Path) -> None:
    async def nonsense(**kwargs: Any) -> protocol.TunnelReply:
        return protocol.TunnelReply(ok=True, result={"object": "list", "data": "x"})

    fake = FakeWorkspaceRunner(root)
    fake.send_command = nonsense  # type: ignore[method-assign]
    with relaying_to(fake):
        assert_error(alice.get(url(session_id)), 503, "runner_unavailable")
