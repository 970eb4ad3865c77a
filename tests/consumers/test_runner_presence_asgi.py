"""``session.runner`` on the session stream (sessions/runner_presence.py): a stream open
on a session hears its runner go offline and online again, and bound and unbound, live
and without an event number."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async

from omnigent_site.users import get_or_create_user
from runners import services as runner_services
from sessions.models import Session, SessionEvent

from .test_stream_asgi import StreamCall, _session

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


async def next_runner_frame(call: StreamCall) -> tuple[bytes, dict[str, Any]]:
    while True:
        body = await call.next_body()
        if b"event: session.runner" in body:
            data = next(line for line in body.split(b"\n") if line.startswith(b"data: "))
            return body, json.loads(data[6:])


async def test_the_stream_hears_its_runner_go_off_and_online_and_unbound(
    make_bundle: Any,
) -> None:
    session_id = await database_sync_to_async(_session)(make_bundle)

    def setup() -> tuple[str, int]:
        alice = get_or_create_user("alice@example.com")
        runner, _token = runner_services.register_runner(owner=alice, name="laptop")
        generation = runner_services.mark_connected(
            runner_id=runner.id, channel_name="test.runner", runner_version="t", workspace={}
        ).generation
        Session.objects.filter(pk=session_id).update(runner=runner)
        return runner.id, generation

    runner_id, generation = await database_sync_to_async(setup)()
    call = StreamCall(session_id)
    assert (await call.start())["status"] == 200
    assert b"event: session.heartbeat" in await call.next_body()
    events_before = await database_sync_to_async(SessionEvent.objects.count)()

    await database_sync_to_async(runner_services.mark_disconnected)(
        runner_id=runner_id, generation=generation
    )
    body, event = await next_runner_frame(call)
    assert b"\nid:" not in body  # live only: no event number to resume from
    assert event == {
        "type": "session.runner",
        "session_id": session_id,
        "runner_id": runner_id,
        "runner_name": "laptop",
        "runner_online": False,
    }
    await database_sync_to_async(runner_services.mark_connected)(
        runner_id=runner_id, channel_name="test.runner2", runner_version="t", workspace={}
    )
    assert (await next_runner_frame(call))[1]["runner_online"] is True

    def unbind() -> None:
        session = Session.objects.get(pk=session_id)
        runner_services.bind_session_runner(
            session=session, actor=get_or_create_user("alice@example.com"), runner_id=""
        )

    await database_sync_to_async(unbind)()
    _, unbound = await next_runner_frame(call)
    assert (unbound["runner_id"], unbound["runner_online"]) == (None, False)
    # Nothing of it was stored in the session's event log.
    assert await database_sync_to_async(SessionEvent.objects.count)() == events_before
    await call.disconnect()
