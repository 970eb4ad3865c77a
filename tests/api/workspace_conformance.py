"""The workspace endpoints' part of ``test_schema_conformance.py`` (files.md §2).

Every documented status of ``…/filesystem``, ``…/filesystem/{path}`` and ``…/search``,
produced through the relay stand-in of ``workspace_fakes`` (the runner's real code on a
temporary folder). Kept in its own module so the shared conformance test only calls it.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync
from django.test import override_settings
from django.utils import timezone

from omnigent_site.users import get_or_create_user
from runners.models import Runner
from sessions.models import Session

from .conftest import ALICE, BOB
from .workspace_fakes import FakeWorkspaceRunner, relaying_to

ENV = "/v1/sessions/{session_id}/resources/environments/{env}"
ROOT = ENV + "/filesystem"
PATH = ENV + "/filesystem/{path}"
SEARCH = ENV + "/search"


def _runner(runner_id: str, *, online: bool) -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id=runner_id,
        owner=get_or_create_user(ALICE),
        channel_name="specific.workspace!x" if online else "",
        connected_at=now if online else None,
        last_seen_at=now if online else None,
    )


def _session(alice: Any, template: str, runner: Runner | None) -> str:
    session_id: str = alice("post", "/v1/sessions", {"agent_id": template}).json()["id"]
    Session.objects.filter(pk=session_id).update(runner=runner)
    return session_id


def exercise_workspace(alice: Any, bob: Any, anon: Any, template: str) -> None:
    online = _runner("runner_token_workspace_on", online=True)
    offline = _runner("runner_token_workspace_off", online=False)
    ws = _session(alice, template, online)
    unbound = _session(alice, template, None)
    gone = _session(alice, template, offline)
    granted = alice(
        "put", "/v1/sessions/{session_id}/permissions", {"user_id": BOB, "level": 1}, session_id=ws
    )
    assert granted.status_code == 200
    with tempfile.TemporaryDirectory() as folder, relaying_to(FakeWorkspaceRunner(Path(folder))):
        root = Path(folder)
        (root / "docs").mkdir()
        (root / "docs" / "a.txt").write_text("alpha\nbeta\n")
        (root / "blob.bin").write_bytes(b"\x00\x01\x02")
        _exercise(alice, bob, anon, ws, unbound, gone)


def _exercise(alice: Any, bob: Any, anon: Any, ws: str, unbound: str, gone: str) -> None:
    ids = {"session_id": ws, "env": "default"}
    big = base64.b64encode(b"x" * 2048).decode()
    with override_settings(OMNIGENT_WORKSPACE_WRITE_MAX_BYTES=1024):
        too_large = alice(
            "put", PATH, {"content": big, "encoding": "base64"}, path="big.bin", **ids
        )
    statuses = [
        # GET …/filesystem
        alice("get", ROOT, **ids),
        alice("get", ROOT, query="?limit=0", **ids),
        anon("get", ROOT, **ids),
        bob("get", ROOT, **ids),
        alice("get", ROOT, session_id=ws, env="scratch"),
        alice("get", ROOT, session_id=unbound, env="default"),
        alice("get", ROOT, session_id=gone, env="default"),
        # GET …/filesystem/{path}
        alice("get", PATH, path="docs", **ids),
        alice("get", PATH, path="docs/a.txt", **ids),
        alice("get", PATH, path="blob.bin", query="?download=1", **ids),
        alice("get", PATH, path="a/../b", **ids),
        anon("get", PATH, path="docs/a.txt", **ids),
        bob("get", PATH, path="docs/a.txt", **ids),
        alice("get", PATH, path="missing.txt", **ids),
        alice("get", PATH, path="docs/a.txt", session_id=unbound, env="default"),
        alice("get", PATH, path="docs/a.txt", session_id=gone, env="default"),
        # PUT
        alice("put", PATH, {"content": "new\n"}, path="docs/new.txt", **ids),
        alice("put", PATH, {"content": 5}, path="docs/new.txt", **ids),
        anon("put", PATH, {"content": "x"}, path="docs/new.txt", **ids),
        bob("put", PATH, {"content": "x"}, path="docs/new.txt", **ids),
        alice("put", PATH, {"content": "x"}, path="x.txt", session_id=ws, env="scratch"),
        alice("put", PATH, {"content": "x"}, path="no/parent.txt", **ids),
        too_large,
        alice("put", PATH, {"content": "x"}, path="x.txt", session_id=gone, env="default"),
        # PATCH
        alice("patch", PATH, {"old_text": "alpha", "new_text": "ALPHA"}, path="docs/a.txt", **ids),
        alice("patch", PATH, {"old_text": "zzz", "new_text": "y"}, path="docs/a.txt", **ids),
        anon("patch", PATH, {"old_text": "a", "new_text": "b"}, path="docs/a.txt", **ids),
        bob("patch", PATH, {"old_text": "a", "new_text": "b"}, path="docs/a.txt", **ids),
        alice("patch", PATH, {"old_text": "a", "new_text": "b"}, path="nope.txt", **ids),
        alice(
            "patch",
            PATH,
            {"old_text": "a", "new_text": "b"},
            path="docs/a.txt",
            session_id=unbound,
            env="default",
        ),
        alice(
            "patch",
            PATH,
            {"old_text": "a", "new_text": "b"},
            path="docs/a.txt",
            session_id=gone,
            env="default",
        ),
        # DELETE
        alice("delete", PATH, path="docs/new.txt", **ids),
        alice("delete", PATH, path="/etc/passwd", **ids),
        anon("delete", PATH, path="docs/a.txt", **ids),
        bob("delete", PATH, path="docs/a.txt", **ids),
        alice("delete", PATH, path="docs/new.txt", **ids),
        alice("delete", PATH, path="docs", **ids),
        alice("delete", PATH, path="docs/a.txt", session_id=gone, env="default"),
        # GET …/search
        alice("get", SEARCH, query="?q=beta", **ids),
        alice("get", SEARCH, query="?q=(&regex=1", **ids),
        anon("get", SEARCH, query="?q=beta", **ids),
        bob("get", SEARCH, query="?q=beta", **ids),
        alice("get", SEARCH, query="?q=beta", session_id=ws, env="scratch"),
        alice("get", SEARCH, query="?q=beta", session_id=unbound, env="default"),
        alice("get", SEARCH, query="?q=beta", session_id=gone, env="default"),
    ]
    assert [r.status_code for r in statuses] == [
        *[200, 400, 401, 403, 404, 409, 503],
        *[200, 200, 200, 400, 401, 403, 404, 409, 503],
        *[200, 400, 401, 403, 404, 409, 413, 503],
        *[200, 400, 401, 403, 404, 409, 503],
        *[204, 400, 401, 403, 404, 409, 503],
        *[200, 400, 401, 403, 404, 409, 503],
    ], [(r.status_code, r.content[:200]) for r in statuses]
    download = statuses[9]
    assert download["Content-Disposition"] == 'attachment; filename="blob.bin"'
    assert async_to_sync(_body)(download) == b"\x00\x01\x02"


async def _body(response: Any) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])
