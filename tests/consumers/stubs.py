"""A stub runner on a real tunnel, and HTTP helpers, for the consumer tests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from omnigent_runner import PROTOCOL_VERSION, protocol
from omnigent_runner.identity import derive_runner_id
from omnigent_site.asgi import application
from runners.models import Runner
from sessions.models import Item, Permission, Session, Turn

ALICE = "alice@example.com"
BOB = "bob@example.com"
TOKEN_HEADER = b"x-omnigent-runner-tunnel-token"
FRAME_TIMEOUT = 3.0
HTTP_TIMEOUT = 15.0
MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hello runner"}]}

in_db = database_sync_to_async


class StubRunner:
    """The runner's end of a live tunnel: reads commands and answers them."""

    def __init__(self, comm: WebsocketCommunicator, runner_id: str) -> None:
        self.comm = comm
        self.runner_id = runner_id

    async def recv(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """The next server frame, checked against the protocol, as its wire dict."""
        text = await self.comm.receive_from(timeout=timeout)
        protocol.decode_server_frame(text)  # raises if the server sent a bad frame
        frame: dict[str, Any] = json.loads(text)
        return frame

    async def send(self, frame: protocol.Frame) -> None:
        await self.comm.send_to(text_data=protocol.encode(frame))

    async def expect(self, kind: str) -> dict[str, Any]:
        frame = await self.recv()
        assert frame["type"] == kind, frame
        return frame

    async def ack(self, frame: dict[str, Any]) -> None:
        await self.send(protocol.Ack(id=frame["id"]))

    async def nack(self, frame: dict[str, Any], code: str = "busy") -> None:
        await self.send(
            protocol.Nack(id=frame["id"], error=protocol.ErrorInfo(code=code, message="no"))
        )

    async def nothing_pending(self) -> None:
        """Prove no command was queued for the runner: the next frame is this probe's ack."""
        await self.send(
            protocol.EventFrame(
                session_id="conv_probe", seq=1, event=protocol.ResponseCreated(response_id="r")
            )
        )
        frame = await self.recv()
        assert frame == {"type": "event.ack", "session_id": "conv_probe", "seq": 1}, frame

    async def drop(self) -> None:
        await self.comm.disconnect(timeout=FRAME_TIMEOUT)


class Stubs:
    def __init__(self) -> None:
        self.opened: list[WebsocketCommunicator] = []

    async def online(
        self, token: str, *, open_sessions: list[str] | None = None, max_turns: int | None = None
    ) -> StubRunner:
        runner_id = derive_runner_id(token)
        comm = WebsocketCommunicator(
            application,
            f"/v1/runners/{runner_id}/tunnel",
            headers=[(TOKEN_HEADER, token.encode())],
        )
        comm.scope["client"] = ("127.0.0.1", 5000)
        self.opened.append(comm)
        connected, _ = await comm.connect(timeout=FRAME_TIMEOUT)
        assert connected
        hello = protocol.Hello(
            protocol=PROTOCOL_VERSION,
            runner_version="stub",
            workspace={"root": "/tmp/stub", "vcs": "none"},
            open_sessions=open_sessions or [],
            max_turns=max_turns,
        )
        await comm.send_to(text_data=protocol.encode(hello))
        welcome = await comm.receive_json_from(timeout=FRAME_TIMEOUT)
        assert welcome["type"] == "welcome", welcome
        return StubRunner(comm, runner_id)

    async def close_all(self) -> None:
        await close_tunnels(self.opened)


def grace_tasks() -> list[asyncio.Task[Any]]:
    """The consumer's pending reconnect-grace timers (``fail_after_grace``)."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and getattr(task.get_coro(), "__name__", "") == "fail_after_grace"
    ]


async def close_tunnels(opened: list[WebsocketCommunicator]) -> None:
    """Disconnect every test tunnel still open and cancel leftover grace timers."""
    for comm in opened:
        future = comm._future
        if future is None or future.done():
            continue
        try:
            await comm.disconnect(timeout=FRAME_TIMEOUT)
        except BaseException:  # noqa: BLE001 - teardown must reach every tunnel
            comm.stop(exceptions=False)
    # Grace timers outlive their tunnel; none may touch the database after the test.
    for task in grace_tasks():
        task.cancel()


async def call(method: str, path: str, user: str, body: Any = None) -> Any:
    client = AsyncClient()
    kwargs: dict[str, Any] = {"headers": {"X-Forwarded-Email": user}}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    async with asyncio.timeout(HTTP_TIMEOUT):
        return await getattr(client, method)(path, **kwargs)


async def post_event(session_id: str, body: dict[str, Any], user: str = ALICE) -> Any:
    return await call("post", f"/v1/sessions/{session_id}/events", user, body)


async def patch_runner(session_id: str, runner_id: str, user: str = ALICE) -> Any:
    return await call("patch", f"/v1/sessions/{session_id}", user, {"runner_id": runner_id})


def start(coro: Any) -> asyncio.Task[Any]:
    """Run an HTTP call in the background while the stub answers the runner's side."""
    return asyncio.ensure_future(coro)


def error_of(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = json.loads(response.content)
    assert list(body) == ["error"] and body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]["message"]


def body_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.content[:500])
    return json.loads(response.content)


async def bind(session: Session, runner: Runner) -> None:
    """Bind through the ORM (no ``session.open`` is sent: the first turn sends it)."""
    await in_db(Session.objects.filter(pk=session.pk).update)(runner=runner)


async def grant(session: Session, user: Any, level: int) -> None:
    await in_db(Permission.objects.create)(session=session, user=user, level=level)


def counts(session_id: str) -> tuple[int, int]:
    return (
        Item.objects.filter(session_id=session_id).count(),
        Turn.objects.filter(session_id=session_id).count(),
    )
