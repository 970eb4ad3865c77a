"""Open streams per user (issue 15, item 9; http-api.md, "Limits on clients").

Through ``omnigent_site.asgi.application``, as daphne drives it: past
``OMNIGENT_MAX_STREAMS_PER_USER`` open streams a user gets 429 ``rate_limited`` with
``Retry-After``; a slot comes back when its stream ends, whether the client goes away or
the session is deleted; the session stream and the session-list updates stream share the
bound; other users and local single-user mode are not limited. The count is per server
process (omnigent_site/stream_slots.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async

from omnigent_site.stream_slots import stream_slots
from omnigent_site.users import get_or_create_user
from sessions.services import create_session_from_bundle

from .asgi_http import http_scope

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

ALICE = "alice@example.com"
BOB = "bob@example.com"


def _session(make_bundle: Any) -> str:
    return create_session_from_bundle(user=get_or_create_user(ALICE), data=make_bundle()).id


def _pk(username: str) -> str:
    return str(get_or_create_user(username).pk)


class Call:
    """One ASGI HTTP request whose response may stay open."""

    def __init__(self, path: str, user: str | None) -> None:
        from omnigent_site.asgi import application

        self.sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        headers = [(b"x-forwarded-email", user.encode())] if user else []
        self.incoming.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        self.task = asyncio.ensure_future(
            application(http_scope(path, headers=headers), self.incoming.get, self.sent.put)
        )

    async def start(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.sent.get(), timeout=10)
        assert message["type"] == "http.response.start"
        return message

    async def body(self) -> bytes:
        while True:
            message = await asyncio.wait_for(self.sent.get(), timeout=10)
            if message["type"] == "http.response.body" and message.get("body"):
                return bytes(message["body"])

    async def disconnect(self) -> None:
        await self.incoming.put({"type": "http.disconnect"})
        await asyncio.wait_for(self.task, timeout=10)


async def open_stream(path: str, user: str | None = ALICE) -> Call:
    call = Call(path, user)
    start = await call.start()
    assert start["status"] == 200, start
    await call.body()  # the first heartbeat (or event): the stream is live
    return call


async def refused(path: str, user: str = ALICE) -> None:
    call = Call(path, user)
    start = await call.start()
    assert start["status"] == 429
    headers = dict(start["headers"])
    assert int(headers[b"Retry-After"]) >= 1
    body = json.loads(await call.body())
    assert body["error"]["code"] == "rate_limited", body
    assert "at most 2" in body["error"]["message"]
    await asyncio.wait_for(call.task, timeout=10)


async def test_streams_past_the_limit_are_429_and_slots_come_back(
    make_bundle: Any, settings: Any
) -> None:
    settings.OMNIGENT_MAX_STREAMS_PER_USER = 2
    session_id = await database_sync_to_async(_session)(make_bundle)
    alice = await database_sync_to_async(_pk)(ALICE)
    path = f"/v1/sessions/{session_id}/stream"
    first = await open_stream(path)
    second = await open_stream("/v1/sessions/updates")  # the list stream shares the bound
    assert stream_slots.open_streams(alice) == 2
    await refused(path)
    await refused("/v1/sessions/updates")
    assert stream_slots.open_streams(alice) == 2

    await first.disconnect()  # the client goes away: its slot comes back
    assert stream_slots.open_streams(alice) == 1
    third = await open_stream(path)
    await refused(path)

    await third.disconnect()
    await second.disconnect()
    assert stream_slots.open_streams(alice) == 0


async def test_a_stream_ended_by_the_server_gives_its_slot_back(
    make_bundle: Any, settings: Any
) -> None:
    """Deleting the session ends its streams with ``[DONE]``: the slots are free at once."""
    settings.OMNIGENT_MAX_STREAMS_PER_USER = 1
    session_id = await database_sync_to_async(_session)(make_bundle)
    alice = await database_sync_to_async(_pk)(ALICE)
    call = await open_stream(f"/v1/sessions/{session_id}/stream")
    assert stream_slots.open_streams(alice) == 1
    from omnigent_site.asgi import application

    from .asgi_http import asgi_request

    status, _headers, _body = await asgi_request(
        application,
        f"/v1/sessions/{session_id}",
        method="DELETE",
        headers=[(b"x-forwarded-email", ALICE.encode())],
    )
    assert status == 200
    while b"[DONE]" not in await call.body():
        pass
    await asyncio.wait_for(call.task, timeout=10)
    assert stream_slots.open_streams(alice) == 0


async def test_each_user_has_their_own_bound(make_bundle: Any, settings: Any) -> None:
    settings.OMNIGENT_MAX_STREAMS_PER_USER = 1
    alice_call = await open_stream("/v1/sessions/updates", ALICE)
    bob_call = await open_stream("/v1/sessions/updates", BOB)
    await bob_call.disconnect()
    await alice_call.disconnect()


async def test_no_bound_in_local_single_user_mode(make_bundle: Any, settings: Any) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    settings.OMNIGENT_MAX_STREAMS_PER_USER = 1
    calls = [await open_stream("/v1/sessions/updates", None) for _ in range(3)]
    for call in calls:
        await call.disconnect()
