"""The message ``POST`` through the server's own handler: its sync work on its thread.

``SessionEventsView.initial`` runs DRF's checks and the event's validation in the trip
adrf makes for ``initial``; the handler stores the message in one more. These requests go through
``omnigent_site.asgi.application`` (``PooledThreadsASGIHandler``, whose request threads
count every call) to a stub runner on a real tunnel.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async

from omnigent_site.asgi import application
from omnigent_site.runtime.handler import RequestThread
from runners.models import Runner
from sessions.models import Item, Session, Turn

from .asgi_http import asgi_request
from .stubs import ALICE, MESSAGE, Stubs, bind

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What every sync call a request hands to its request thread runs."""
    seen: list[str] = []
    real_submit = RequestThread.submit

    def submit(self: RequestThread, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # ``sync_to_async`` submits its thread handler with the wrapped call last.
        wrapped = getattr(fn, "args", ())[-1:] or [fn]
        target = getattr(wrapped[0], "func", wrapped[0])
        seen.append(getattr(target, "__qualname__", repr(target)))
        return real_submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(RequestThread, "submit", submit)
    return seen


async def post(session_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _headers, content = await asgi_request(
        application,
        f"/v1/sessions/{session_id}/events",
        method="POST",
        headers=[
            (b"x-forwarded-email", ALICE.encode()),
            (b"content-type", b"application/json"),
        ],
        body=json.dumps(body).encode(),
    )
    return status, json.loads(content)


async def test_a_message_to_an_open_session_makes_one_trip_to_its_thread(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], calls: list[str]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    await bind(session, runner)
    first = asyncio.ensure_future(post(session.id, {"type": "message", "data": MESSAGE}))
    await stub.ack(await stub.expect("session.open"))
    await stub.ack(await stub.expect("turn.start"))
    status, _body = await first
    assert status == 202

    calls.clear()
    pending = asyncio.ensure_future(post(session.id, {"type": "message", "data": MESSAGE}))
    turn = await stub.expect("turn.start")
    assert not pending.done()  # the 202 waits for the runner's acknowledgement
    await stub.ack(turn)
    status, body = await pending
    assert status == 202, body
    assert body["response_id"] == turn["response_id"]
    # DRF's checks and the validation, then the storing, each on the request's thread.
    view_calls = [call for call in calls if call.startswith("SessionEventsView.")]
    assert view_calls == ["SessionEventsView.initial", "SessionEventsView.accept_message"], calls
    stored = await database_sync_to_async(Turn.objects.get)(id=body["response_id"])
    assert stored.session_id == session.id
    assert await database_sync_to_async(Item.objects.filter(id=body["item_id"]).exists)()


async def test_an_invalid_message_is_refused_before_anything_is_stored(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await stubs.online(token)
    await bind(session, runner)
    status, body = await post(
        session.id, {"type": "message", "data": {"role": "assistant", "content": "hi"}}
    )
    assert status == 400, body
    assert body["error"]["code"] == "invalid_input"
    assert "role 'user'" in json.dumps(body)
    assert not await database_sync_to_async(Turn.objects.filter(session_id=session.id).exists)()
