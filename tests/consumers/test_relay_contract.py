"""The HTTP side of the relay against a stub runner on a real tunnel (http-api.md, Events).

The stub runner is a ``WebsocketCommunicator`` on ``omnigent_site.asgi.application``
that completed ``hello``; the HTTP calls go through ``django.test.AsyncClient``. Both
share the event loop and the in-memory channel layer, so a request that waits for
the runner is started as a task while the stub reads and answers the command.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from runners import services
from runners.models import Runner
from sessions.models import Item, Permission, Session, Turn
from tests.tools import WEATHER_TOOL as TOOL

from .stubs import (
    ALICE,
    BOB,
    MESSAGE,
    Stubs,
    bind,
    body_of,
    counts,
    error_of,
    grant,
    patch_runner,
    post_event,
    start,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


in_db = database_sync_to_async


# --------------------------------------------------------------- PATCH runner_id


async def test_owner_binds_an_online_runner_and_it_gets_session_open(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    response = await patch_runner(session.id, runner.id)
    body = body_of(response, 200)
    assert body["runner_id"] == runner.id
    assert body["runner_online"] is True
    opened = await stub.expect("session.open")
    assert opened["session_id"] == session.id
    assert opened["agent"]["id"] == session.agent_id
    assert opened["history"] == []
    await stub.ack(opened)
    await stub.nothing_pending()
    stored = await in_db(Session.objects.get)(pk=session.id)
    assert stored.runner_id == runner.id
    assert stored.runner_generation_opened == 1


async def test_only_the_owner_binds_a_runner(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], bob: Any
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await grant(session, bob, Permission.Level.MANAGE)
    error_of(await patch_runner(session.id, runner.id, user=BOB), 403, "forbidden")
    assert (await in_db(Session.objects.get)(pk=session.id)).runner_id is None
    await stub.nothing_pending()


async def test_binding_an_offline_or_unknown_runner_is_invalid_input(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, _token = runner_token  # registered, never connected
    message = error_of(await patch_runner(session.id, runner.id), 400, "invalid_input")
    assert f"runner '{runner.id}' is not registered" in message
    unknown = "runner_token_" + "0" * 32
    message = error_of(await patch_runner(session.id, unknown), 400, "invalid_input")
    assert f"runner '{unknown}' is not registered" in message
    assert (await in_db(Session.objects.get)(pk=session.id)).runner_id is None


async def test_binding_another_users_runner_is_forbidden(
    stubs: Stubs, session: Session, bob: Any
) -> None:
    bobs_runner, token = await in_db(services.register_runner)(owner=bob, name="bob's")
    stub = await stubs.online(token)
    error_of(await patch_runner(session.id, bobs_runner.id), 403, "forbidden")
    assert (await in_db(Session.objects.get)(pk=session.id)).runner_id is None
    await stub.nothing_pending()


async def test_empty_runner_id_unbinds(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    body_of(await patch_runner(session.id, runner.id), 200)
    await stub.ack(await stub.expect("session.open"))
    body = body_of(await patch_runner(session.id, ""), 200)
    assert body["runner_id"] is None
    assert body["runner_online"] is True
    closed = await stub.expect("session.close")
    assert closed["session_id"] == session.id
    assert (await in_db(Session.objects.get)(pk=session.id)).runner_id is None


# -------------------------------------------------------- function_call_output


def tool_output(call_id: str = "call_42", output: str = '{"temp": 21}') -> dict[str, Any]:
    return {"type": "function_call_output", "data": {"call_id": call_id, "output": output}}


async def test_function_call_output_is_relayed_as_exactly_tool_result(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, tool_output()))
    frame = await stub.expect("tool_result")
    assert set(frame) == {"type", "call_id", "output", "id", "session_id"}, frame
    assert frame["call_id"] == "call_42"
    assert frame["output"] == '{"temp": 21}'
    assert frame["session_id"] == session.id
    assert not pending.done()  # the answer waits for the runner's ack
    await stub.ack(frame)
    assert body_of(await pending, 202) == {"queued": True, "item_id": "call_42"}


async def test_the_202_is_json_for_api_clients_and_the_browsable_page_for_browsers(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    for accept, content_type in (
        ("application/json", "application/json"),
        ("text/html", "text/html; charset=utf-8"),
    ):
        pending = start(
            AsyncClient().post(
                f"/v1/sessions/{session.id}/events",
                data=json.dumps(tool_output()),
                content_type="application/json",
                headers={"X-Forwarded-Email": ALICE, "Accept": accept},
            )
        )
        await stub.ack(await stub.expect("tool_result"))
        response = await pending
        assert response.status_code == 202, response.content[:300]
        assert response["Content-Type"] == content_type
        assert "Accept" in response["Vary"]
        if accept == "application/json":
            assert json.loads(response.content) == {"queued": True, "item_id": "call_42"}
        else:
            assert b"call_42" in response.content and b"<html" in response.content


async def test_function_call_output_without_a_runner_is_503(session: Session) -> None:
    error_of(await post_event(session.id, tool_output()), 503, "runner_unavailable")


async def test_function_call_output_with_an_offline_runner_is_503(
    session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, _token = runner_token
    await bind(session, runner)
    error_of(await post_event(session.id, tool_output()), 503, "runner_unavailable")


async def test_function_call_output_not_acknowledged_in_time_is_503(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RELAY_TIMEOUT_S = 0.5
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    started = time.monotonic()
    pending = start(post_event(session.id, tool_output()))
    await stub.expect("tool_result")
    error_of(await pending, 503, "runner_unavailable")
    assert time.monotonic() - started >= 0.5


async def test_function_call_output_when_the_tunnel_drops_is_503_after_the_reconnect_wait(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    """Well before the relay's deadline: the caller waits for the runner to come back
    only for ``OMNIGENT_RUNNER_RECONNECT_WAIT_S``."""
    settings.OMNIGENT_RELAY_TIMEOUT_S = 10.0
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 0.5
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    started = time.monotonic()
    pending = start(post_event(session.id, tool_output()))
    await stub.expect("tool_result")
    await stub.drop()
    error_of(await pending, 503, "runner_unavailable")
    assert time.monotonic() - started < 5.0


async def test_a_function_call_output_whose_tunnel_drops_is_sent_again_when_the_runner_reconnects(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    """The tool result follows the runner to its next tunnel (a re-sent ``tool_result``
    never runs twice: tunnel.md), and the client gets its 202."""
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 30.0
    runner, token = runner_token
    first = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, tool_output()))
    lost = await first.expect("tool_result")  # never acknowledged on this tunnel
    await first.drop()
    second = await stubs.online(token)
    results = await ack_until_answered(second, pending, "tool_result")
    assert [(r["call_id"], r["output"]) for r in results] == [(lost["call_id"], lost["output"])]
    assert body_of(await pending, 202) == {"queued": True, "item_id": "call_42"}


async def test_function_call_output_nacked_is_503(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, tool_output()))
    await stub.nack(await stub.expect("tool_result"))
    error_of(await pending, 503, "runner_unavailable")


async def test_function_call_output_needs_call_id_and_output(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    for data in ({"call_id": "call_1"}, {"output": "x"}, {"call_id": "call_1", "output": 3}):
        body = {"type": "function_call_output", "data": data}
        error_of(await post_event(session.id, body), 400, "invalid_input")
    await stub.nothing_pending()


# --------------------------------------------------------------------- message


def message_event(**extra: Any) -> dict[str, Any]:
    return {"type": "message", "data": MESSAGE, **extra}


async def test_message_without_a_runner_is_503_and_stores_nothing(session: Session) -> None:
    error_of(await post_event(session.id, message_event()), 503, "runner_unavailable")
    assert await in_db(counts)(session.id) == (0, 0)
    assert (await in_db(Session.objects.get)(pk=session.id)).status == Session.Status.IDLE


async def test_message_with_an_offline_runner_is_503_and_stores_nothing(
    session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, _token = runner_token  # bound but never connected
    await bind(session, runner)
    message = error_of(await post_event(session.id, message_event()), 503, "runner_unavailable")
    assert runner.id in message
    assert await in_db(counts)(session.id) == (0, 0)


async def test_message_opens_the_session_then_starts_the_turn(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)

    pending = start(post_event(session.id, message_event(tools=[TOOL])))
    opened = await stub.expect("session.open")
    assert opened["session_id"] == session.id
    await stub.ack(opened)
    turn = await stub.expect("turn.start")
    assert set(turn) == {
        "type",
        "id",
        "session_id",
        "response_id",
        "input",
        "tools",
        "request_id",
        "budgets",
    }, turn
    # No budget anywhere: an empty set of lines, which also clears a removed one.
    assert turn["budgets"] == {"session": None, "user": None}
    assert turn["session_id"] == session.id
    assert turn["tools"] == [TOOL]
    [user_item] = turn["input"]
    assert user_item["type"] == "message"
    assert user_item["role"] == "user"
    assert user_item["content"] == MESSAGE["content"]
    assert user_item["response_id"] == turn["response_id"]
    assert user_item["created_by"] == ALICE
    assert not pending.done()
    await stub.ack(turn)
    body = body_of(await pending, 202)
    assert body == {
        "queued": True,
        "item_id": user_item["id"],
        "response_id": turn["response_id"],
    }

    stored = await in_db(Turn.objects.get)(id=body["response_id"])
    assert stored.session_id == session.id
    assert stored.status == Turn.Status.QUEUED
    assert stored.tools == [TOOL]
    item = await in_db(Item.objects.get)(session_id=session.id, id=body["item_id"])
    assert item.data["role"] == "user"
    assert item.response_id == body["response_id"]
    current = await in_db(Session.objects.get)(pk=session.id)
    assert current.status == Session.Status.RUNNING
    assert current.active_response_id == body["response_id"]

    # The session is open on this connection now: the next message only starts a turn.
    pending = start(post_event(session.id, message_event()))
    second = await stub.expect("turn.start")
    assert second["response_id"] != turn["response_id"]
    await stub.ack(second)
    assert body_of(await pending, 202)["response_id"] == second["response_id"]


async def ack_until_answered(
    stub: Any, pending: asyncio.Task[Any], kind: str = "turn.start"
) -> list[dict[str, Any]]:
    """Acknowledge every command until the request is answered; the ``kind`` frames seen.

    A new tunnel's resume sends the session and its queued turn too, so the request's
    own commands may come after (or beside) the resume's: the runner takes each once."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while not pending.done():
            try:
                frame = await stub.recv(timeout=0.2)
            except TimeoutError:
                continue
            assert frame["type"] in ("session.open", "turn.start", kind), frame
            if frame["type"] == kind:
                seen.append(frame)
            await stub.ack(frame)
    return seen


async def test_a_message_whose_tunnel_drops_is_sent_again_when_the_runner_reconnects(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    """A server process restarting closes the runner's tunnel while a message is on its
    way: the caller sends it again on the runner's next tunnel (the runner ignores a
    ``turn.start`` it already has), and the client gets its 202."""
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 30.0
    runner, token = runner_token
    first = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, message_event()))
    await first.ack(await first.expect("session.open"))
    lost = await first.expect("turn.start")  # never acknowledged on this tunnel
    await first.drop()
    second = await stubs.online(token)
    starts = await ack_until_answered(second, pending)
    assert starts and {start["response_id"] for start in starts} == {lost["response_id"]}
    assert all(start["input"] == lost["input"] for start in starts)
    assert body_of(await pending, 202)["response_id"] == lost["response_id"]
    turn = await in_db(Turn.objects.get)(id=lost["response_id"])
    assert turn.status == Turn.Status.QUEUED
    assert await in_db(counts)(session.id) == (1, 1)


async def test_a_message_to_a_runner_that_dropped_moments_ago_waits_for_it(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 30.0
    runner, token = runner_token
    first = await stubs.online(token)
    await bind(session, runner)
    await first.drop()
    assert not (await in_db(Runner.objects.get)(pk=runner.pk)).online
    pending = start(post_event(session.id, message_event()))
    await asyncio.sleep(0.3)  # the request is waiting (nothing to await on its side)
    assert not pending.done()
    second = await stubs.online(token)
    starts = await ack_until_answered(second, pending)
    response_id = body_of(await pending, 202)["response_id"]
    assert {start["response_id"] for start in starts} == {response_id}


async def test_a_message_to_a_runner_that_does_not_come_back_is_503_and_the_turn_failed(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 0.3
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, message_event()))
    await stub.ack(await stub.expect("session.open"))
    lost = await stub.expect("turn.start")
    await stub.drop()
    error_of(await pending, 503, "runner_unavailable")
    turn = await in_db(Turn.objects.get)(id=lost["response_id"])
    assert turn.status == Turn.Status.FAILED
    assert turn.error["code"] == "runner_unreachable"


async def test_message_with_a_plain_string_content_is_accepted(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token, open_sessions=[session.id])
    await bind(session, runner)
    await in_db(Session.objects.filter(pk=session.id).update)(runner_generation_opened=1)
    body = {"type": "message", "data": {"role": "user", "content": "plain text"}}
    pending = start(post_event(session.id, body))
    turn = await stub.expect("turn.start")
    assert turn["input"][0]["content"] == [{"type": "input_text", "text": "plain text"}]
    await stub.ack(turn)
    body_of(await pending, 202)


async def test_message_not_acknowledged_fails_the_turn_and_keeps_the_item(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_RELAY_TIMEOUT_S = 0.5
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, message_event()))
    await stub.ack(await stub.expect("session.open"))
    turn = await stub.expect("turn.start")  # never acknowledged
    error_of(await pending, 503, "runner_unavailable")

    stored = await in_db(Turn.objects.get)(id=turn["response_id"])
    assert stored.status == Turn.Status.FAILED
    assert stored.error["code"] == "runner_unreachable"
    assert stored.completed_at is not None
    assert await in_db(
        Item.objects.filter(session_id=session.id, id=turn["input"][0]["id"]).exists
    )()
    current = await in_db(Session.objects.get)(pk=session.id)
    assert current.status == Session.Status.FAILED
    assert current.last_task_error["code"] == "runner_unreachable"


async def test_message_nacked_by_the_runner_is_503(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, message_event()))
    await stub.ack(await stub.expect("session.open"))
    turn = await stub.expect("turn.start")
    await stub.nack(turn)
    error_of(await pending, 503, "runner_unavailable")
    stored = await in_db(Turn.objects.get)(id=turn["response_id"])
    assert stored.error["code"] == "runner_unreachable"


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "function", "function": {"name": "bad name!"}}],
        [{"type": "function", "function": {"name": ""}}],
        [{"type": "function"}],
        [{"type": "retrieval", "function": {"name": "ok"}}],
        [{"type": "function", "function": {"name": "ok", "parameters": "not a schema"}}],
        "not a list",
    ],
)
async def test_message_with_malformed_tools_is_400(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], tools: Any
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    error_of(await post_event(session.id, message_event(tools=tools)), 400, "invalid_input")
    assert await in_db(counts)(session.id) == (0, 0)
    await stub.nothing_pending()


async def test_interrupt_without_a_runner_is_accepted(session: Session) -> None:
    body = body_of(await post_event(session.id, {"type": "interrupt"}), 202)
    assert body == {"queued": False}


async def test_interrupt_is_relayed_to_the_runner(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, {"type": "interrupt"}))
    frame = await stub.expect("turn.interrupt")
    assert set(frame) == {"type", "id", "session_id"}
    assert frame["session_id"] == session.id
    await stub.ack(frame)
    assert body_of(await pending, 202) == {"queued": False}


async def test_interrupt_nacked_is_still_accepted(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    pending = start(post_event(session.id, {"type": "interrupt"}))
    await stub.nack(await stub.expect("turn.interrupt"))
    assert body_of(await pending, 202) == {"queued": False}


async def test_unknown_event_type_is_400(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    error_of(await post_event(session.id, {"type": "explode", "data": {}}), 400, "invalid_input")
    error_of(await post_event(session.id, {"data": {}}), 400, "invalid_input")
    await stub.nothing_pending()


async def test_read_only_user_cannot_post_events(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], bob: Any
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    await grant(session, bob, Permission.Level.READ)
    for body in (message_event(), tool_output(), {"type": "interrupt"}):
        error_of(await post_event(session.id, body, user=BOB), 403, "forbidden")
    assert await in_db(counts)(session.id) == (0, 0)
    await stub.nothing_pending()


async def test_stranger_gets_404(session: Session) -> None:
    error_of(await post_event(session.id, message_event(), user=BOB), 404, "not_found")
