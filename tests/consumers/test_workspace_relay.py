"""``workspace.*`` rpc over a real tunnel, against a stub runner (files.md §2, tunnel.md).

What the fake relay of the API tests cannot show: the rpc frame the runner gets, the
runner's error status crossing the consumer and the channel layer, and a runner that
stops answering or drops the tunnel mid-request giving 503 (at the deadline, or at
once), never a hang.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from omnigent_runner import protocol
from runners.models import Runner
from sessions.models import Session

from .stubs import Stubs, bind, body_of, call, error_of, start

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

USER = "alice@example.com"


def files(session: Session, rest: str = "") -> str:
    return f"/v1/sessions/{session.id}/resources/environments/default/filesystem{rest}"


async def opened_stub(stubs: Stubs, session: Session, runner_token: tuple[Runner, str]) -> Any:
    """A stub runner bound to the session; answers the ``session.open`` the first call sends."""
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    return stub


async def test_a_read_is_relayed_as_rpc_and_its_answer_rendered(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub = await opened_stub(stubs, session, runner_token)
    request = start(call("get", files(session, "/notes.txt"), USER))
    await stub.ack(await stub.expect("session.open"))
    rpc = await stub.expect("rpc")
    assert rpc["method"] == "workspace.read"
    assert rpc["params"]["path"] == "notes.txt"
    assert rpc["params"]["session_id"] == session.id
    assert rpc["params"]["max_bytes"] == 2 * 1024 * 1024
    answer = {
        "object": "session.environment.filesystem.file",
        "path": "notes.txt",
        "bytes": 2,
        "modified_at": 1,
        "encoding": "utf-8",
        "content": "hi",
        "truncated": False,
        "extra": "dropped",
    }
    await stub.send(protocol.RpcResult(id=rpc["id"], ok=True, result=answer))
    body = body_of(await request, 200)
    assert body == {key: value for key, value in answer.items() if key != "extra"}
    # Opened once on this connection: the next call goes straight to the rpc.
    second = start(call("get", files(session), USER))
    rpc = await stub.expect("rpc")
    assert rpc["params"]["path"] == "."
    listing = {"object": "list", "data": [], "has_more": False, "last_id": None}
    await stub.send(protocol.RpcResult(id=rpc["id"], ok=True, result=listing))
    assert body_of(await second, 200) == listing


async def test_the_runners_error_status_reaches_the_client(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub = await opened_stub(stubs, session, runner_token)
    request = start(call("put", files(session, "/.git/config"), USER, {"content": "x"}))
    await stub.ack(await stub.expect("session.open"))
    rpc = await stub.expect("rpc")
    assert rpc["method"] == "workspace.write"
    error = protocol.ErrorInfo(code="forbidden", message="'.git/config' is inside .git")
    await stub.send(protocol.RpcResult(id=rpc["id"], ok=False, error=error, status=403))
    assert "inside .git" in error_of(await request, 403, "forbidden")
    # An error without a status is the runner failing: 503.
    request = start(call("get", files(session), USER))
    rpc = await stub.expect("rpc")
    await stub.send(
        protocol.RpcResult(id=rpc["id"], ok=False, error=protocol.ErrorInfo(code="boom"))
    )
    error_of(await request, 503, "runner_unavailable")


async def test_a_silent_runner_is_503_at_the_deadline(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RELAY_TIMEOUT_S = 0.5
    stub = await opened_stub(stubs, session, runner_token)
    await _open_first(stub, session)
    began = time.monotonic()
    request = start(call("get", files(session), USER))
    await stub.expect("rpc")  # never answered
    error_of(await request, 503, "runner_unavailable")
    assert time.monotonic() - began < 5


async def test_a_runner_gone_mid_request_is_503_at_once(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RELAY_TIMEOUT_S = 30.0
    stub = await opened_stub(stubs, session, runner_token)
    await _open_first(stub, session)
    began = time.monotonic()
    request = start(call("get", files(session, "/big.bin"), USER))
    await stub.expect("rpc")
    await stub.drop()
    error_of(await request, 503, "runner_unavailable")
    assert time.monotonic() - began < 10  # the tunnel's close fails the call, not the deadline


async def _open_first(stub: Any, session: Session) -> None:
    """Open the session on the stub with one call whose rpc is answered."""
    request = start(call("get", files(session), USER))
    opened = await stub.expect("session.open")
    await stub.ack(opened)
    rpc = await stub.expect("rpc")
    listing = {"object": "list", "data": [], "has_more": False, "last_id": None}
    await stub.send(protocol.RpcResult(id=rpc["id"], ok=True, result=listing))
    body_of(await request, 200)


async def test_absolute_paths_in_a_runners_error_never_reach_the_client(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    """A runner that answers with its machine's paths (an older one, or an error it did
    not expect): the workspace root it reported in ``hello`` (``/tmp/stub``) and the
    file names of an OSError's text are taken out, whatever the status."""
    stub = await opened_stub(stubs, session, runner_token)
    await _open_first(stub, session)
    answers = [
        (400, "[Errno 36] File name too long: '/tmp/stub/" + "n" * 300 + "'"),
        (None, "[Errno 13] Permission denied: '/srv/elsewhere/x' -> '/srv/other/y'"),
        (409, "cannot write '/tmp/stub/notes/a.txt': No space left on device"),
    ]
    for status, message in answers:
        request = start(call("put", files(session, "/notes/a.txt"), USER, {"content": "x"}))
        rpc = await stub.expect("rpc")
        error = protocol.ErrorInfo(code="failed", message=message)
        await stub.send(protocol.RpcResult(id=rpc["id"], ok=False, error=error, status=status))
        expected = {400: (400, "invalid_input"), 409: (409, "conflict")}
        shown = error_of(await request, *expected.get(status or 0, (503, "runner_unavailable")))
        assert "/tmp/stub" not in shown and "/srv" not in shown, shown
    assert "cannot write 'notes/a.txt'" in shown


async def test_a_path_over_the_limits_is_refused_without_asking_the_runner(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub = await opened_stub(stubs, session, runner_token)
    for path in ("n" * 300 + ".txt", "a" * 5000):
        for method, body in (
            ("put", {"content": "x"}),
            ("patch", {"old_text": "a", "new_text": "b"}),
            ("delete", None),
            ("get", None),
        ):
            shown = error_of(
                await call(method, files(session, f"/{path}"), USER, body), 400, "invalid_input"
            )
            assert "bytes" in shown and "limit" in shown
    await stub.nothing_pending()
