"""The runner tunnel consumer (tunnel.md) driven frame by frame through the ASGI app.

Each test plays the runner's side with a ``WebsocketCommunicator`` on the real
``omnigent_site.asgi.application`` and the in-memory channel layer. Every wait is
bounded: frames are awaited with ``receive_json_from(timeout=...)``, the reconnect
grace task is awaited directly, and database state is polled against a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from omnigent_runner import PROTOCOL_VERSION, protocol
from omnigent_runner.identity import derive_runner_id, new_binding_token
from omnigent_site.asgi import application
from runners import runner_events, services
from runners.models import Runner
from runners.relay import RelayError, send_command
from sessions.models import Item, Session, SessionEvent, Turn
from sessions.services import create_session_from_bundle
from tests.turns import handed_to_runner
from workspaces.models import FileChange

from .stubs import close_tunnels, grace_tasks

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

ALICE = "alice@example.com"
BOB = "bob@example.com"
TOKEN_HEADER = b"x-omnigent-runner-tunnel-token"
LOOPBACK = ("127.0.0.1", 5000)
FRAME_TIMEOUT = 3.0
USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}

in_db = database_sync_to_async


# --------------------------------------------------------------------- helpers


def tunnel_path(runner_id: str) -> str:
    return f"/v1/runners/{runner_id}/tunnel"


def hello_frame(**extra: Any) -> dict[str, Any]:
    """A valid ``hello`` as sent on the wire; ``extra`` overrides fields (even wrongly)."""
    hello = protocol.Hello(
        protocol=PROTOCOL_VERSION,
        runner_version="test-1.2.3",
        workspace={"root": "/tmp/workspace", "vcs": "none"},
    )
    return {**protocol.to_builtins(hello), **extra}


async def receive(comm: WebsocketCommunicator, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
    return await comm.receive_json_from(timeout=timeout)


async def expect_close(
    comm: WebsocketCommunicator, code: int, *, timeout: float = FRAME_TIMEOUT
) -> list[dict[str, Any]]:
    """Read until the server closes the socket; returns the frames sent before it."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no close {code} within {timeout} s; got {frames}"
        message = await comm.receive_output(timeout=remaining)
        if message["type"] == "websocket.close":
            assert message.get("code") == code, (message, frames)
            return frames
        assert message["type"] == "websocket.send", message
        frames.append(json.loads(message["text"]))


async def probe(comm: WebsocketCommunicator) -> dict[str, Any]:
    """The next frame after an event for an unknown session: shows nothing else was queued.

    The consumer handles frames in order, so any frame it had queued (a stray
    ``session.open``) would arrive before this acknowledgement.
    """
    probe_event = protocol.EventFrame(
        session_id="conv_probe", seq=7, event=protocol.ResponseCreated(response_id="resp_probe")
    )
    await comm.send_to(text_data=protocol.encode(probe_event))
    frame = await receive(comm)
    assert frame == {"type": "event.ack", "session_id": "conv_probe", "seq": 7}, frame
    return frame


async def send_event(
    comm: WebsocketCommunicator, session_id: str, seq: int, event: dict[str, Any]
) -> dict[str, Any]:
    """Send one runner event and return the server's ``event.ack``."""
    await comm.send_json_to({"type": "event", "session_id": session_id, "seq": seq, "event": event})
    ack = await receive(comm)
    assert ack["type"] == "event.ack", ack
    assert ack["session_id"] == session_id, ack
    return ack


async def eventually(
    check: Callable[[], Any], *, timeout: float = FRAME_TIMEOUT, interval: float = 0.02
) -> Any:
    """Poll the synchronous ``check`` (run in the DB thread) until it returns truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await in_db(check)()
        if value:
            return value
        assert time.monotonic() < deadline, f"condition not met within {timeout} s"
        await asyncio.sleep(interval)


async def past_grace(tasks: list[asyncio.Task[Any]], *, dropped_at: float, grace: float) -> None:
    """Return once the reconnect grace that began at ``dropped_at`` is over.

    The consumer's grace timers are awaited directly, so their work is done on return;
    only if none was found does the deadline itself (plus a margin) stand in for them.
    """
    if tasks:
        async with asyncio.timeout(grace + 3):
            await asyncio.gather(*tasks)
        assert time.monotonic() >= dropped_at + grace - 0.05
        return
    remaining = dropped_at + grace + 0.3 - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)


def runner_row(runner_id: str) -> Runner:
    return Runner.objects.get(pk=runner_id)


class Tunnels:
    """Opens communicators to the real ASGI app and closes every one at teardown."""

    def __init__(self) -> None:
        self.opened: list[WebsocketCommunicator] = []

    def make(
        self,
        token: str | None,
        *,
        runner_id: str | None = None,
        client: tuple[str, int] | None = LOOPBACK,
    ) -> WebsocketCommunicator:
        if runner_id is None:
            runner_id = derive_runner_id(token or "unused")
        headers = [] if token is None else [(TOKEN_HEADER, token.encode())]
        comm = WebsocketCommunicator(application, tunnel_path(runner_id), headers=headers)
        if client is not None:
            comm.scope["client"] = client
        self.opened.append(comm)
        return comm

    async def connect(self, token: str | None, **kwargs: Any) -> WebsocketCommunicator:
        comm = self.make(token, **kwargs)
        connected, _ = await comm.connect(timeout=FRAME_TIMEOUT)
        assert connected, "the tunnel upgrade was refused"
        return comm

    async def refused(self, token: str | None, **kwargs: Any) -> int:
        comm = self.make(token, **kwargs)
        connected, code = await comm.connect(timeout=FRAME_TIMEOUT)
        assert connected is False, "the tunnel upgrade was accepted"
        return code

    async def online(
        self, token: str, **hello: Any
    ) -> tuple[WebsocketCommunicator, dict[str, Any]]:
        """Connect, say hello and return the communicator and the ``welcome``."""
        comm = await self.connect(token)
        await comm.send_json_to(hello_frame(**hello))
        welcome = await receive(comm)
        assert welcome["type"] == "welcome", welcome
        return comm, welcome

    async def drop(self, comm: WebsocketCommunicator) -> None:
        """The runner's side goes away; waits for the consumer's disconnect handler."""
        await comm.disconnect(timeout=FRAME_TIMEOUT)

    async def close_all(self) -> None:
        await close_tunnels(self.opened)


@pytest.fixture
async def tunnels() -> AsyncIterator[Tunnels]:
    layer = get_channel_layer()
    await layer.flush()
    opened = Tunnels()
    try:
        yield opened
    finally:
        await opened.close_all()
        await layer.flush()


@pytest.fixture
def registered(alice: Any) -> tuple[Runner, str]:
    return services.register_runner(owner=alice, name="laptop")


@pytest.fixture
def bound_session(
    alice: Any, registered: tuple[Runner, str], make_bundle: Callable[..., bytes]
) -> Session:
    runner, _token = registered
    session = create_session_from_bundle(user=alice, data=make_bundle())
    Session.objects.filter(pk=session.pk).update(runner=runner)
    session.refresh_from_db()
    return session


# ------------------------------------------------------------------ refusals


async def test_no_token_header_is_refused(tunnels: Tunnels, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    await tunnels.refused(None, runner_id=derive_runner_id("whatever"))
    assert "refused tunnel" in caplog.text


async def test_blank_token_is_refused(tunnels: Tunnels, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    await tunnels.refused("   ", runner_id=derive_runner_id("whatever"))
    assert "refused tunnel" in caplog.text


async def test_path_id_must_match_the_token(
    tunnels: Tunnels, registered: tuple[Runner, str], caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    runner, token = registered
    other = derive_runner_id(token + "-other")
    await tunnels.refused(token, runner_id=other)
    assert token not in caplog.text
    assert await in_db(lambda: runner_row(runner.id).channel_name)() == ""


async def test_a_token_that_is_not_utf8_is_refused_not_repaired(
    tunnels: Tunnels, settings: Any, caplog: Any
) -> None:
    """Decoded with ``errors="replace"``, the bytes ``tok\\xff`` spelled the allow-listed
    token ``tok\\ufffd``: a token matched without its bytes being known."""
    settings.OMNIGENT_RUNNER_TUNNEL_TOKEN = ["tok\ufffd"]
    caplog.set_level(logging.INFO)
    comm = WebsocketCommunicator(
        application,
        tunnel_path(derive_runner_id("tok\ufffd")),
        headers=[(TOKEN_HEADER, b"tok\xff")],
    )
    comm.scope["client"] = LOOPBACK
    tunnels.opened.append(comm)
    connected, _ = await comm.connect(timeout=FRAME_TIMEOUT)
    assert connected is False
    assert "token is not UTF-8" in caplog.text


async def test_unknown_runner_is_refused(tunnels: Tunnels, settings: Any, caplog: Any) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = False
    settings.OMNIGENT_RUNNER_TUNNEL_TOKEN = []
    caplog.set_level(logging.INFO)
    token = new_binding_token()
    await tunnels.refused(token)
    assert "unknown runner" in caplog.text
    assert token not in caplog.text
    assert not await in_db(Runner.objects.filter(pk=derive_runner_id(token)).exists)()


async def test_revoked_runner_is_refused(
    tunnels: Tunnels, registered: tuple[Runner, str], caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    runner, token = registered
    await in_db(services.revoke_runner)(runner=runner)
    await tunnels.refused(token)
    assert "revoked" in caplog.text
    assert token not in caplog.text


# ------------------------------------------------------------------ accepted


async def test_registered_token_is_accepted(
    tunnels: Tunnels, registered: tuple[Runner, str], caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    runner, token = registered
    comm, welcome = await tunnels.online(token)
    assert welcome["runner_id"] == runner.id
    await tunnels.drop(comm)
    assert token not in caplog.text


async def test_allow_listed_token_auto_registers_a_runner_owned_by_the_runner_owner(
    tunnels: Tunnels, settings: Any
) -> None:
    token = new_binding_token()
    settings.OMNIGENT_RUNNER_TUNNEL_TOKEN = [token]
    settings.OMNIGENT_LOCAL_SINGLE_USER = False
    comm, welcome = await tunnels.online(token)
    runner_id = derive_runner_id(token)
    assert welcome["runner_id"] == runner_id
    owner = await in_db(lambda: runner_row(runner_id).owner.get_username())()
    assert owner == settings.OMNIGENT_RUNNER_OWNER == "local"


async def test_local_single_user_mode_accepts_a_loopback_peer(
    tunnels: Tunnels, settings: Any
) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    settings.OMNIGENT_RUNNER_TUNNEL_TOKEN = []
    token = new_binding_token()
    comm, welcome = await tunnels.online(token)
    runner_id = derive_runner_id(token)
    assert welcome["runner_id"] == runner_id
    assert await in_db(lambda: runner_row(runner_id).owner.get_username())() == "local"


async def test_local_single_user_mode_refuses_a_remote_peer(
    tunnels: Tunnels, settings: Any
) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    settings.OMNIGENT_RUNNER_TUNNEL_TOKEN = []
    token = new_binding_token()
    await tunnels.refused(token, client=("10.0.0.5", 5000))
    assert not await in_db(Runner.objects.filter(pk=derive_runner_id(token)).exists)()


# ----------------------------------------------------------------- handshake


async def test_hello_gets_welcome_and_marks_the_runner_online(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session, settings: Any
) -> None:
    runner, token = registered
    comm, welcome = await tunnels.online(token)
    assert welcome == {
        "type": "welcome",
        "runner_id": runner.id,
        "heartbeat_s": settings.OMNIGENT_HEARTBEAT_S,
        "sessions": [{"session_id": bound_session.id, "last_acked_seq": 0}],
        "event_batches": True,
    }
    row = await in_db(runner_row)(runner.id)
    assert row.online
    assert row.channel_name
    assert row.generation == 1
    assert row.connected_at is not None
    assert row.last_seen_at is not None
    assert row.runner_version == "test-1.2.3"
    assert row.workspace == {"root": "/tmp/workspace", "vcs": "none"}


async def test_first_frame_not_hello_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_json_to({"type": "pong", "ts": 1})
    assert await expect_close(comm, 4001) == []
    assert await in_db(lambda: runner_row(runner.id).generation)() == 0


async def test_no_hello_in_time_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_HELLO_TIMEOUT_S = 0.3
    _runner, token = registered
    comm = await tunnels.connect(token)
    started = time.monotonic()
    assert await expect_close(comm, 4001) == []
    assert time.monotonic() - started >= 0.25


async def test_malformed_first_frame_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    _runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_to(text_data="{not json")
    assert await expect_close(comm, 4001) == []


async def test_unsupported_protocol_closes_4002(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_json_to(hello_frame(protocol=2))
    assert await expect_close(comm, 4002) == []
    assert await in_db(lambda: runner_row(runner.id).channel_name)() == ""


async def test_malformed_and_binary_frames_after_hello_are_ignored(
    tunnels: Tunnels, registered: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_HEARTBEAT_S = 0.2
    _runner, token = registered
    comm, _welcome = await tunnels.online(token)
    await comm.send_to(text_data="{not json")
    await comm.send_to(text_data="[1, 2]")
    await comm.send_json_to({"no_type": True})
    await comm.send_json_to({"type": "no.such.frame"})
    await comm.send_to(bytes_data=b"\x00\x01binary")
    await probe(comm)
    ping = await receive(comm)
    assert ping["type"] == "ping"
    await comm.send_json_to({"type": "pong", "ts": ping["ts"]})
    assert (await receive(comm))["type"] == "ping"


async def test_a_first_frame_that_is_not_utf8_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    """A ``str`` with a lone surrogate (what text that is not UTF-8 becomes when a
    server decodes it leniently) used to raise ``UnicodeEncodeError`` in the consumer."""
    _runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_to(text_data='{"type": "hello", "protocol": 1, "x": "\udcc0"}')
    assert await expect_close(comm, 4001) == []


async def test_frames_that_are_not_utf8_after_hello_are_ignored(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    """Refused as other malformed frames are: logged, not acknowledged, the tunnel
    serves on. Binary messages (raw bytes that are not UTF-8 among them) are ignored."""
    _runner, token = registered
    sid = bound_session.id
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    created = '{"type": "response.created", "response_id": "resp_\ud800"}'
    await comm.send_to(
        text_data='{"type": "event", "session_id": "'
        + sid
        + '", "seq": 1, "event": '
        + created
        + "}"
    )
    await comm.send_to(text_data='{"type": "pong", "ts": 1, "note": "\udfff"}')
    await comm.send_to(text_data='{"type": "ack", "id": "\udcff"}')
    for raw in (b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"):
        await comm.send_to(bytes_data=b'{"type": "pong", "ts": 1, "x": "' + raw + b'"}')
    await probe(comm)  # the probe's ack is the first frame: nothing above was acknowledged
    assert (await in_db(Session.objects.get)(pk=sid)).last_runner_seq == 0


async def test_hello_with_wrongly_typed_fields_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_json_to(hello_frame(open_sessions="conv_1"))
    assert await expect_close(comm, 4001) == []
    assert await in_db(lambda: runner_row(runner.id).generation)() == 0


async def test_hello_of_another_protocol_closes_4002_even_if_unreadable(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    """A newer runner's hello may not parse as protocol 1: it still learns the version
    is the problem (4002), not that its hello was malformed (4001)."""
    _runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_json_to({"type": "hello", "protocol": 2, "workspace": ["new", "shape"]})
    assert await expect_close(comm, 4002) == []


async def test_unknown_frame_before_hello_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    _runner, token = registered
    comm = await tunnels.connect(token)
    await comm.send_json_to({"type": "no.such.frame"})
    assert await expect_close(comm, 4001) == []


async def test_an_unreadable_answer_fails_its_command_at_once(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    """docs/protocol.md: an answer that names a pending command but cannot be parsed
    fails that command with ``invalid_reply`` instead of leaving it to the deadline."""
    runner, token = registered
    comm, _ = await tunnels.online(token)
    channel = await in_db(lambda: runner_row(runner.id).channel_name)()
    started = time.monotonic()
    pending = asyncio.ensure_future(
        send_command(
            channel_name=channel,
            command=protocol.TurnInterrupt(session_id="conv_x"),
            timeout=10.0,
        )
    )
    command = await receive(comm)
    assert command["type"] == "turn.interrupt", command
    await comm.send_json_to({"type": "nack", "id": command["id"], "error": "no object"})
    with pytest.raises(RelayError) as failed:
        await asyncio.wait_for(pending, FRAME_TIMEOUT)
    assert failed.value.code == "invalid_reply"
    assert time.monotonic() - started < 5.0
    # A later answer for it is only logged: the command is no longer pending.
    await comm.send_json_to({"type": "ack", "id": command["id"]})
    await probe(comm)


async def test_a_nack_without_an_error_object_is_a_rejection(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    runner, token = registered
    comm, _ = await tunnels.online(token)
    channel = await in_db(lambda: runner_row(runner.id).channel_name)()
    pending = asyncio.ensure_future(
        send_command(channel_name=channel, command=protocol.TurnInterrupt(session_id="conv_x"))
    )
    command = await receive(comm)
    await comm.send_json_to({"type": "nack", "id": command["id"]})
    with pytest.raises(RelayError) as failed:
        await asyncio.wait_for(pending, FRAME_TIMEOUT)
    assert (failed.value.code, failed.value.message) == (
        "rejected",
        "the runner rejected the command",
    )


async def test_an_event_with_an_unreadable_payload_is_acknowledged_and_skipped(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    """The envelope is valid, so the seq is stored and acknowledged (the runner must
    not resend it forever); the payload is skipped."""
    _runner, token = registered
    sid = bound_session.id
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    missing_item_id = {"type": "response.output_text.delta", "response_id": response.id}
    assert (await send_event(comm, sid, 1, missing_item_id))["seq"] == 1
    assert (await send_event(comm, sid, 2, {"type": "from.a.newer.runner"}))["seq"] == 2
    await comm.send_json_to({"type": "event", "session_id": sid, "seq": 3, "event": "text"})
    assert (await receive(comm))["seq"] == 3
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.last_runner_seq == 3
    shown = await in_db(
        lambda: list(SessionEvent.objects.filter(session_id=sid, type="response.output_text.delta"))
    )()
    assert shown == []


async def test_an_event_frame_without_a_valid_envelope_is_ignored_unacknowledged(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    sid = bound_session.id
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    created = {"type": "response.created", "response_id": "resp_x"}
    for envelope in (
        {"session_id": sid, "seq": 0},
        {"session_id": sid, "seq": True},
        {"session_id": 5, "seq": 1},
        {"seq": 1},
    ):
        await comm.send_json_to({"type": "event", **envelope, "event": created})
    await probe(comm)  # the probe's ack is the first frame: none of those was acknowledged
    assert (await in_db(Session.objects.get)(pk=sid)).last_runner_seq == 0


# ------------------------------------------------------------------ liveness


async def test_server_pings_and_closes_a_silent_runner_with_4003(
    tunnels: Tunnels, registered: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_HEARTBEAT_S = 0.2
    _runner, token = registered
    comm, welcome = await tunnels.online(token)
    assert welcome["heartbeat_s"] == 0.2
    started = time.monotonic()
    frames = await expect_close(comm, 4003, timeout=3.0)
    assert time.monotonic() - started >= 3 * 0.2
    assert frames, "expected pings before the close"
    for frame in frames:
        assert set(frame) == {"type", "ts"} and frame["type"] == "ping", frame
        assert isinstance(frame["ts"], int | float)


async def test_answering_pings_keeps_the_tunnel_open(
    tunnels: Tunnels, registered: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_HEARTBEAT_S = 0.2
    runner, token = registered
    comm, _welcome = await tunnels.online(token)
    started = time.monotonic()
    # Six pings answered take ~1.2 s: twice the 3 x heartbeat a silent runner gets.
    for _ in range(6):
        ping = await receive(comm, timeout=1.0)
        assert ping["type"] == "ping", ping
        await comm.send_json_to({"type": "pong", "ts": ping["ts"]})
    assert time.monotonic() - started > 3 * 0.2
    await probe(comm)
    assert (await in_db(runner_row)(runner.id)).online


async def test_newest_connection_wins(tunnels: Tunnels, registered: tuple[Runner, str]) -> None:
    runner, token = registered
    first, _ = await tunnels.online(token)
    first_channel = (await in_db(runner_row)(runner.id)).channel_name
    second, _ = await tunnels.online(token)
    row = await in_db(runner_row)(runner.id)
    assert row.generation == 2
    second_channel = row.channel_name
    assert second_channel and second_channel != first_channel
    await expect_close(first, 4000)
    # The replaced tunnel's disconnect handler must not mark the runner offline.
    await tunnels.drop(first)
    row = await in_db(runner_row)(runner.id)
    assert row.online
    assert row.channel_name == second_channel
    assert row.generation == 2
    assert grace_tasks() == []
    await probe(second)


# ---------------------------------------------------- bound sessions on connect


async def test_bound_session_is_opened_after_welcome(
    tunnels: Tunnels,
    registered: tuple[Runner, str],
    bound_session: Session,
    make_bundle: Callable[..., bytes],
) -> None:
    _runner, token = registered
    comm, welcome = await tunnels.online(token)
    assert welcome["sessions"] == [{"session_id": bound_session.id, "last_acked_seq": 0}]
    opened = await receive(comm)
    assert opened["type"] == "session.open"
    assert opened["session_id"] == bound_session.id
    assert isinstance(opened["id"], str) and opened["id"]
    agent = await in_db(lambda: Session.objects.get(pk=bound_session.id).agent)()
    assert opened["agent"]["id"] == agent.id
    assert opened["agent"]["version"] == agent.version
    assert base64.b64decode(opened["agent"]["bundle_b64"]) == make_bundle()
    assert opened["history"] == []
    await comm.send_json_to({"type": "ack", "id": opened["id"]})
    await probe(comm)
    generation = await eventually(
        lambda: Session.objects.get(pk=bound_session.id).runner_generation_opened
    )
    assert generation == 1


async def test_sessions_the_runner_reports_open_are_not_reopened(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    comm, welcome = await tunnels.online(token, open_sessions=[bound_session.id])
    assert welcome["sessions"] == [{"session_id": bound_session.id, "last_acked_seq": 0}]
    await probe(comm)  # no session.open came first
    session = await in_db(Session.objects.get)(pk=bound_session.id)
    assert session.runner_generation_opened == 1


async def test_restarted_runner_gets_open_turns_again(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    item, response = await in_db(runner_events.accept_message)(
        session_id=bound_session.id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    for _attempt in range(2):  # first connect, then a restart with nothing open
        comm, _welcome = await tunnels.online(token)
        opened = await receive(comm)
        assert opened["type"] == "session.open"
        # A turn the runner has not started brings its message with its turn.start only.
        assert opened["history"] == []
        start = await receive(comm)
        assert start["type"] == "turn.start", start
        assert start["session_id"] == bound_session.id
        assert start["response_id"] == response.id
        assert [entry["id"] for entry in start["input"]] == [item.id]
        assert start["input"][0]["role"] == "user"
        assert start["tools"] == []
        for command in (opened, start):
            await comm.send_json_to({"type": "ack", "id": command["id"]})
        await probe(comm)
        await tunnels.drop(comm)
        session = await in_db(Session.objects.get)(pk=bound_session.id)
        assert session.status == Session.Status.RUNNING
    assert (await in_db(Turn.objects.get)(id=response.id)).status == Turn.Status.QUEUED


# ------------------------------------------------------------------ events


def assistant_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def item_done(response_id: str, item_id: str, text: str = "hello") -> dict[str, Any]:
    return {
        "type": "response.output_item.done",
        "response_id": response_id,
        "item": assistant_item(item_id, text),
    }


def item_count(session_id: str, item_id: str) -> int:
    return Item.objects.filter(session_id=session_id, id=item_id).count()


def done_events(session_id: str) -> list[str]:
    """Item ids of the ``response.output_item.done`` events watchers were shown, in order."""
    return [
        payload["item"]["id"]
        for payload in SessionEvent.objects.filter(
            session_id=session_id, type="response.output_item.done"
        )
        .order_by("seq")
        .values_list("payload", flat=True)
    ]


async def open_turn(session: Session) -> Turn:
    """A message's turn, handed to the runner (it holds a slot, usage.md)."""
    _item, response = await in_db(runner_events.accept_message)(
        session_id=session.id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    return await in_db(handed_to_runner)(response)


async def test_events_are_stored_once_and_acknowledged(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[bound_session.id])
    sid = bound_session.id

    ack = await send_event(comm, sid, 1, item_done(response.id, "item_a1"))
    assert ack == {"type": "event.ack", "session_id": sid, "seq": 1}
    item = await in_db(Item.objects.get)(session_id=sid, id="item_a1")
    assert item.type == "message"
    assert item.response_id == response.id
    assert item.data["content"][0]["text"] == "hello"

    # The same seq again: acknowledged again, stored once, not shown to watchers again.
    ack = await send_event(comm, sid, 1, item_done(response.id, "item_a1"))
    assert ack["seq"] == 1
    assert await in_db(item_count)(sid, "item_a1") == 1
    assert await in_db(done_events)(sid) == ["item_a1"]

    ack = await send_event(comm, sid, 2, item_done(response.id, "item_a2", "second"))
    assert ack["seq"] == 2
    assert await in_db(item_count)(sid, "item_a2") == 1
    assert await in_db(done_events)(sid) == ["item_a1", "item_a2"]
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.last_runner_seq == 2


async def test_a_burst_of_events_is_stored_in_order_and_acknowledged_up_to_the_last(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[bound_session.id])
    sid = bound_session.id
    for seq in range(1, 41):
        await comm.send_json_to(
            {
                "type": "event",
                "session_id": sid,
                "seq": seq,
                "event": item_done(response.id, f"item_b{seq}"),
            }
        )
    acked = 0
    while acked < 40:
        ack = await receive(comm)
        assert ack["type"] == "event.ack" and ack["session_id"] == sid, ack
        assert ack["seq"] > acked  # cumulative and increasing
        acked = ack["seq"]
    assert await in_db(done_events)(sid) == [f"item_b{seq}" for seq in range(1, 41)]
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.last_runner_seq == 40


def batch_of(*elements: tuple[str, int, Any]) -> dict[str, Any]:
    """An ``events`` frame as the runner sends it."""
    return {
        "type": "events",
        "events": [
            {"type": "event", "session_id": sid, "seq": seq, "event": event}
            for sid, seq, event in elements
        ],
    }


async def test_an_events_frame_is_stored_as_its_events_would_be_alone(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    """Duplicates, an unreadable payload and an invalid envelope inside a batch are
    handled as they are in single frames; the rest is stored in order."""
    _runner, token = registered
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[bound_session.id])
    sid = bound_session.id
    await send_event(comm, sid, 1, item_done(response.id, "item_c1"))
    await comm.send_json_to(
        batch_of(
            (sid, 1, item_done(response.id, "item_c1")),  # a duplicate
            (sid, 2, item_done(response.id, "item_c2")),
            (sid, 0, item_done(response.id, "item_bad")),  # invalid envelope: dropped
            (sid, 3, {"type": "from.a.newer.runner"}),  # skipped, still acknowledged
            (sid, 4, item_done(response.id, "item_c4")),
        )
    )
    acked = 0
    while acked < 4:
        ack = await receive(comm)
        # This runner did not offer event_batches in its hello: plain acks.
        assert ack["type"] == "event.ack" and ack["session_id"] == sid, ack
        acked = ack["seq"]
    assert await in_db(done_events)(sid) == ["item_c1", "item_c2", "item_c4"]
    assert await in_db(item_count)(sid, "item_bad") == 0
    assert (await in_db(Session.objects.get)(pk=sid)).last_runner_seq == 4


async def test_a_runner_that_reads_event_acks_gets_several_sessions_acked_at_once(
    tunnels: Tunnels,
    registered: tuple[Runner, str],
    bound_session: Session,
    alice: Any,
    make_bundle: Callable[..., bytes],
) -> None:
    runner, token = registered
    other = await in_db(create_session_from_bundle)(user=alice, data=make_bundle())
    await in_db(lambda: Session.objects.filter(pk=other.pk).update(runner=runner))()
    first, second = await open_turn(bound_session), await open_turn(other)
    comm, welcome = await tunnels.online(
        token,
        open_sessions=[bound_session.id, other.id],
        capabilities={"event_batches": True},
    )
    assert welcome["event_batches"] is True
    await comm.send_json_to(
        batch_of(
            (bound_session.id, 1, item_done(first.id, "item_d1")),
            (other.id, 1, item_done(second.id, "item_e1")),
            (bound_session.id, 2, item_done(first.id, "item_d2")),
        )
    )
    # One frame, so one writer round, so one acknowledgement for both sessions.
    frame = await receive(comm)
    assert frame == {
        "type": "event.acks",
        "acks": [
            {"type": "event.ack", "session_id": bound_session.id, "seq": 2},
            {"type": "event.ack", "session_id": other.id, "seq": 1},
        ],
    }
    # A round that stored one session's events alone gets a plain ack.
    await comm.send_json_to(batch_of((other.id, 2, item_done(second.id, "item_e2"))))
    assert await receive(comm) == {"type": "event.ack", "session_id": other.id, "seq": 2}
    assert await in_db(done_events)(bound_session.id) == ["item_d1", "item_d2"]
    assert await in_db(done_events)(other.id) == ["item_e1", "item_e2"]


async def test_an_events_frame_whose_list_cannot_be_read_is_ignored(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    comm, _ = await tunnels.online(token, open_sessions=[bound_session.id])
    await comm.send_json_to({"type": "events", "events": {"not": "a list"}})
    await comm.send_json_to({"type": "events", "events": []})
    await probe(comm)  # still open, and nothing was acknowledged before the probe


async def test_unacknowledged_events_resent_after_reconnect_are_stored_once(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    response = await open_turn(bound_session)
    sid = bound_session.id
    events = {1: item_done(response.id, "item_r1"), 2: item_done(response.id, "item_r2")}

    comm, _ = await tunnels.online(token, open_sessions=[sid])
    for seq, event in events.items():
        await comm.send_json_to({"type": "event", "session_id": sid, "seq": seq, "event": event})
    await tunnels.drop(comm)  # before reading either ack

    comm, welcome = await tunnels.online(token, open_sessions=[sid])
    assert welcome["sessions"] == [{"session_id": sid, "last_acked_seq": 2}]
    for seq, event in events.items():
        ack = await send_event(comm, sid, seq, event)
        assert ack["seq"] == 2  # cumulative: everything up to 2 is stored
    assert await in_db(item_count)(sid, "item_r1") == 1
    assert await in_db(item_count)(sid, "item_r2") == 1
    assert await in_db(done_events)(sid) == ["item_r1", "item_r2"]


async def test_events_for_a_session_bound_to_another_runner_are_acked_and_dropped(
    tunnels: Tunnels,
    alice: Any,
    registered: tuple[Runner, str],
    make_bundle: Callable[..., bytes],
) -> None:
    _runner, token = registered

    def other_session() -> Session:
        other_runner, _ = services.register_runner(owner=alice, name="other")
        session = create_session_from_bundle(user=alice, data=make_bundle())
        Session.objects.filter(pk=session.pk).update(runner=other_runner)
        return session

    foreign = await in_db(other_session)()
    comm, welcome = await tunnels.online(token)
    assert welcome["sessions"] == []
    ack = await send_event(comm, foreign.id, 1, item_done("resp_nope", "item_foreign"))
    assert ack["seq"] == 1
    session = await in_db(Session.objects.get)(pk=foreign.id)
    assert session.last_runner_seq == 0
    assert await in_db(item_count)(foreign.id, "item_foreign") == 0


async def test_session_status_events_and_sticky_failed(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    sid = bound_session.id
    response = await open_turn(bound_session)
    await in_db(Session.objects.filter(pk=sid).update)(status="idle", active_response_id=None)
    comm, _ = await tunnels.online(token, open_sessions=[sid])

    status = {"type": "session.status", "response_id": response.id}
    await send_event(comm, sid, 1, {**status, "status": "running"})
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.status == Session.Status.RUNNING
    assert session.active_response_id == response.id

    error = {"code": "model_error", "message": "the model broke"}
    await send_event(comm, sid, 2, {**status, "status": "failed", "error": error})
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.status == Session.Status.FAILED
    assert session.last_task_error == error

    await send_event(comm, sid, 3, {"type": "session.status", "status": "idle"})
    session = await in_db(Session.objects.get)(pk=sid)
    assert session.status == Session.Status.FAILED
    assert session.last_task_error == error


async def test_response_completed_finishes_the_turn(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    sid = bound_session.id
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    await send_event(comm, sid, 1, {"type": "response.created", "response_id": response.id})
    assert (await in_db(Turn.objects.get)(id=response.id)).status == "in_progress"
    await send_event(comm, sid, 2, {"type": "response.completed", "response_id": response.id})
    stored = await in_db(Turn.objects.get)(id=response.id)
    assert stored.status == Turn.Status.COMPLETED
    assert stored.completed_at is not None
    assert stored.error is None


async def test_workspace_changes_are_stored_and_announced(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session
) -> None:
    _runner, token = registered
    sid = bound_session.id
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    changes = {
        "type": "workspace.changes",
        "environment_id": "default",
        "mode": "agent_edit",
        "entries": [
            {
                "path": "sub/hello.txt",
                "status": "created",
                "bytes": 6,
                "modified_at": 1718000000,
                "lines_added": 1,
                "lines_removed": 0,
                "before": None,
                "after": "hello\n",
            }
        ],
    }
    await send_event(comm, sid, 1, changes)
    rows = await in_db(lambda: list(FileChange.objects.filter(session_id=sid)))()
    assert [(row.path, row.name, row.status, row.after) for row in rows] == [
        ("sub/hello.txt", "hello.txt", "created", "hello\n")
    ]
    announced = await in_db(
        lambda: list(
            SessionEvent.objects.filter(
                session_id=sid, type="session.changed_files.invalidated"
            ).values_list("payload", flat=True)
        )
    )()
    assert announced == [
        {
            "type": "session.changed_files.invalidated",
            "session_id": sid,
            "environment_id": "default",
        }
    ]


# ---------------------------------------------------------- reconnect grace


GRACE_S = 1.0


def busy_idle_pair(alice: Any, runner: Runner, bundle: bytes) -> tuple[Session, Turn, Session]:
    busy = create_session_from_bundle(user=alice, data=bundle)
    idle = create_session_from_bundle(user=alice, data=bundle)
    Session.objects.filter(pk__in=[busy.pk, idle.pk]).update(runner=runner)
    _item, response = runner_events.accept_message(
        session_id=busy.id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    handed_to_runner(response)
    busy.refresh_from_db()
    assert busy.status == Session.Status.RUNNING
    return busy, response, idle


async def test_reconnect_within_grace_keeps_the_turn_running(
    tunnels: Tunnels,
    alice: Any,
    registered: tuple[Runner, str],
    make_bundle: Callable[..., bytes],
    settings: Any,
) -> None:
    settings.OMNIGENT_RECONNECT_GRACE_S = GRACE_S
    runner, token = registered
    busy, response, idle = await in_db(busy_idle_pair)(alice, runner, make_bundle())
    comm, _ = await tunnels.online(token, open_sessions=[busy.id, idle.id])
    await tunnels.drop(comm)
    dropped_at = time.monotonic()
    pending = grace_tasks()
    assert not (await in_db(runner_row)(runner.id)).online

    comm, _ = await tunnels.online(token, open_sessions=[busy.id, idle.id])
    await past_grace(pending, dropped_at=dropped_at, grace=GRACE_S)
    session = await in_db(Session.objects.get)(pk=busy.id)
    assert session.status == Session.Status.RUNNING
    assert session.last_task_error is None
    assert (await in_db(Turn.objects.get)(id=response.id)).status == Turn.Status.QUEUED
    assert (await in_db(Session.objects.get)(pk=idle.id)).status == Session.Status.IDLE
    await probe(comm)


async def test_runner_gone_past_grace_fails_its_busy_sessions(
    tunnels: Tunnels,
    alice: Any,
    registered: tuple[Runner, str],
    make_bundle: Callable[..., bytes],
    settings: Any,
) -> None:
    settings.OMNIGENT_RECONNECT_GRACE_S = GRACE_S
    runner, token = registered
    busy, response, idle = await in_db(busy_idle_pair)(alice, runner, make_bundle())
    comm, _ = await tunnels.online(token, open_sessions=[busy.id, idle.id])
    await tunnels.drop(comm)
    dropped_at = time.monotonic()
    pending = grace_tasks()

    # Inside the grace the session still reads running.
    assert (await in_db(Session.objects.get)(pk=busy.id)).status == Session.Status.RUNNING

    await past_grace(pending, dropped_at=dropped_at, grace=GRACE_S)
    session = await eventually(
        lambda: Session.objects.filter(pk=busy.id, status=Session.Status.FAILED).first()
    )
    assert session.last_task_error["code"] == "runner_disconnected"
    assert session.active_response_id is None
    failed = await in_db(Turn.objects.get)(id=response.id)
    assert failed.status == Turn.Status.FAILED
    assert failed.error["code"] == "runner_disconnected"
    assert failed.completed_at is not None
    idle_now = await in_db(Session.objects.get)(pk=idle.id)
    assert idle_now.status == Session.Status.IDLE
    assert idle_now.last_task_error is None


# --------------------------------------------------------------------- revoke


async def test_revoking_a_connected_runner_closes_its_tunnel(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    runner, token = registered
    comm, _ = await tunnels.online(token)
    current = await in_db(runner_row)(runner.id)
    await in_db(services.revoke_runner)(runner=current)
    await expect_close(comm, 4004)
    await tunnels.drop(comm)
    await tunnels.refused(token)
    assert not (await in_db(runner_row)(runner.id)).online
