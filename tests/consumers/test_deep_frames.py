"""Runner frames nesting too deep, through the real tunnel consumer (issue 15, item 1).

A frame deeper than ``OMNIGENT_MAX_JSON_DEPTH`` plus the frame margin is a
``ProtocolError`` (``omnigent_runner/json_text.py``) mapped like any invalid frame: an
event with a readable envelope is acknowledged and skipped, an answer fails the command
it names at once, a ``hello`` closes 4001; the tunnel stays up after the handshake.
Before, ~1,000 levels raised ``RecursionError`` inside the consumer.
"""

# The fixtures (tunnels, registered, bound_session) come from the consumer tests' module.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from omnigent_runner import protocol
from omnigent_runner.json_text import FRAME_DEPTH_MARGIN
from runners.models import Runner
from runners.relay import RelayError, send_command
from sessions.models import Session, SessionEvent

from .test_tunnel_consumer import (  # noqa: F401  (fixtures)
    FRAME_TIMEOUT,
    Tunnels,
    bound_session,
    expect_close,
    hello_frame,
    in_db,
    open_turn,
    probe,
    receive,
    registered,
    runner_row,
    tunnels,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

DEPTHS = [protocol.DEFAULT_FRAME_DEPTH + 1, 990, 5000]


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_too_deep_event_is_acknowledged_and_skipped(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session, depth: int
) -> None:
    _runner, token = registered
    sid = bound_session.id
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    event = (
        '{"type": "response.output_item.done", "response_id": "' + response.id + '", '
        '"item": {"type": "message", "deep": ' + nested(depth) + "}}"
    )
    await comm.send_to(
        text_data='{"type": "event", "session_id": "' + sid + '", "seq": 1, "event": ' + event + "}"
    )
    assert await receive(comm) == {"type": "event.ack", "session_id": sid, "seq": 1}
    assert (await in_db(Session.objects.get)(pk=sid)).last_runner_seq == 1
    done = await in_db(
        lambda: SessionEvent.objects.filter(
            session_id=sid, type="response.output_item.done"
        ).count()
    )()
    assert done == 0
    await probe(comm)  # still serving


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_too_deep_answer_fails_its_command_at_once(
    tunnels: Tunnels, registered: tuple[Runner, str], depth: int
) -> None:
    runner, token = registered
    comm, _ = await tunnels.online(token)
    channel = await in_db(lambda: runner_row(runner.id).channel_name)()
    pending = asyncio.ensure_future(
        send_command(
            channel_name=channel,
            command=protocol.TurnInterrupt(session_id="conv_x"),
            timeout=10.0,
        )
    )
    command = await receive(comm)
    await comm.send_to(
        text_data='{"type": "rpc.result", "id": "' + command["id"] + '", "ok": true, '
        '"result": ' + nested(depth) + "}"
    )
    with pytest.raises(RelayError) as failed:
        await asyncio.wait_for(pending, FRAME_TIMEOUT)
    assert failed.value.code == "invalid_reply"
    assert "deeper than" in failed.value.message
    await probe(comm)


async def test_a_too_deep_hello_closes_4001(
    tunnels: Tunnels, registered: tuple[Runner, str]
) -> None:
    _runner, token = registered
    comm = await tunnels.connect(token)
    hello = json.dumps(hello_frame())[:-1] + ', "deep": ' + nested(5000) + "}"
    await comm.send_to(text_data=hello)
    assert await expect_close(comm, 4001) == []


async def test_the_limit_follows_the_setting(
    tunnels: Tunnels, registered: tuple[Runner, str], bound_session: Session, settings: Any
) -> None:
    settings.OMNIGENT_MAX_JSON_DEPTH = 4  # frames: 4 + the margin
    _runner, token = registered
    sid = bound_session.id
    response = await open_turn(bound_session)
    comm, _ = await tunnels.online(token, open_sessions=[sid])
    depth = 4 + FRAME_DEPTH_MARGIN - 1  # inside the frame and the event: one level too deep
    event = (
        '{"type": "response.output_text.delta", "response_id": "' + response.id + '", '
        '"item_id": "item_1", "delta": "x", "extra": ' + nested(depth) + "}"
    )
    await comm.send_to(
        text_data='{"type": "event", "session_id": "' + sid + '", "seq": 1, "event": ' + event + "}"
    )
    assert (await receive(comm))["seq"] == 1
    shown = await in_db(
        lambda: SessionEvent.objects.filter(
            session_id=sid, type="response.output_text.delta"
        ).count()
    )()
    assert shown == 0
