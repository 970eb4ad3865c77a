"""The stream view at the ASGI level: resources are released, the log is pruned.

These tests drive ``omnigent_site.asgi.application`` directly with ASGI messages,
so they can end a connection at an exact moment and look inside the in-memory
channel layer afterwards.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from omnigent_site.asgi import application, django_asgi_app
from omnigent_site.runtime.handler import RequestThreadPool
from omnigent_site.users import get_or_create_user
from sessions import sse as sse_module
from sessions.eventlog import record_event, session_group
from sessions.models import SessionEvent
from sessions.services import create_session_from_bundle

from .asgi_http import asgi_get, http_scope

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


def _session(make_bundle: Any) -> str:
    user = get_or_create_user("alice@example.com")
    return create_session_from_bundle(user=user, data=make_bundle()).id


def _record(session_id: str, count: int) -> None:
    for index in range(count):
        with transaction.atomic():
            record_event(session_id=session_id, payload={"type": "test.event", "n": index})


class StreamCall:
    """One ASGI HTTP request to the stream, with its messages observable."""

    def __init__(
        self, session_id: str, *, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        scope = http_scope(
            f"/v1/sessions/{session_id}/stream",
            headers=[(b"x-forwarded-email", b"alice@example.com"), *(headers or [])],
        )
        self.incoming.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        self.task = asyncio.ensure_future(application(scope, self.incoming.get, self.sent.put))

    async def next_body(self) -> bytes:
        while True:
            message = await asyncio.wait_for(self.sent.get(), timeout=10)
            if message["type"] == "http.response.body" and message.get("body"):
                return bytes(message["body"])

    async def start(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.sent.get(), timeout=10)
        assert message["type"] == "http.response.start"
        return message

    async def disconnect(self) -> None:
        await self.incoming.put({"type": "http.disconnect"})
        await asyncio.wait_for(self.task, timeout=10)


async def test_a_client_that_goes_away_leaves_no_task_and_no_group_membership(
    make_bundle: Any,
) -> None:
    session_id = await database_sync_to_async(_session)(make_bundle)
    layer = get_channel_layer()
    group = session_group(session_id)
    tasks_before = len(asyncio.all_tasks())

    call = StreamCall(session_id)
    start = await call.start()
    assert start["status"] == 200
    assert b"event: session.heartbeat" in await call.next_body()
    assert len(layer.groups.get(group, {})) == 1

    await call.disconnect()
    assert call.task.done()
    assert not layer.groups.get(group)
    await asyncio.sleep(0)  # let cancelled helpers finish unwinding
    leftovers = [t for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()]
    assert len(leftovers) <= tasks_before


async def test_replay_then_live_has_no_gap_and_no_duplicate(make_bundle: Any) -> None:
    session_id = await database_sync_to_async(_session)(make_bundle)
    await database_sync_to_async(_record)(session_id, 5)

    call = StreamCall(session_id, headers=[(b"last-event-id", b"2")])
    await call.start()
    received = b""
    while received.count(b"event: test.event") < 3:
        received += await call.next_body()
    await database_sync_to_async(_record)(session_id, 2)
    while received.count(b"event: test.event") < 5:
        received += await call.next_body()
    ids = [int(line.split(b": ")[1]) for line in received.split(b"\n") if line.startswith(b"id: ")]
    assert ids == [3, 4, 5, 6, 7]
    await call.disconnect()


async def test_the_event_log_is_pruned_to_the_retention(make_bundle: Any, settings: Any) -> None:
    settings.OMNIGENT_EVENT_RETENTION = 30
    session_id = await database_sync_to_async(_session)(make_bundle)
    await database_sync_to_async(_record)(session_id, 250)

    def stored() -> list[int]:
        return list(
            SessionEvent.objects.filter(session_id=session_id)
            .order_by("seq")
            .values_list("seq", flat=True)
        )

    seqs = await database_sync_to_async(stored)()
    # Pruning runs every 100 events: at 200 it kept 171..200, then 201..250 arrived.
    assert seqs == list(range(171, 251))


async def test_a_long_stream_joins_its_group_again_before_the_membership_expires(
    make_bundle: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.OMNIGENT_STREAM_HEARTBEAT_S = 0.05
    monkeypatch.setattr(sse_module, "GROUP_REFRESH_S", 0.0)  # renew at every wake-up
    layer = get_channel_layer()
    session_id = await database_sync_to_async(_session)(make_bundle)
    group = session_group(session_id)
    call = StreamCall(session_id)
    await call.start()
    assert b"event: session.heartbeat" in await call.next_body()
    [channel] = layer.groups[group]
    # As if the stream had joined longer ago than the layer keeps members.
    layer.groups[group][channel] = time.time() - 2 * layer.group_expiry
    assert b"event: session.heartbeat" in await call.next_body()  # a wake-up: renewed
    layer._next_sweep = 0.0
    layer._clean_expired()
    assert channel in layer.groups.get(group, {})

    await database_sync_to_async(_record)(session_id, 1)
    received = b""
    while b"event: test.event" not in received:
        received += await call.next_body()
    await call.disconnect()


async def test_an_open_stream_gives_its_thread_back_to_the_pool(
    make_bundle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher costs a socket and a task, not a request thread, for as long as it stays."""
    pool = RequestThreadPool(max_idle=4)
    monkeypatch.setattr(django_asgi_app.application, "threads", pool)
    session_id = await database_sync_to_async(_session)(make_bundle)

    # From event 0: the first event arrives whether it is stored before or after the
    # stream has read the log.
    call = StreamCall(session_id, headers=[(b"last-event-id", b"0")])
    assert (await call.start())["status"] == 200
    assert b"event: session.heartbeat" in await call.next_body()
    await database_sync_to_async(_record)(session_id, 1)
    assert b"event: test.event" in await call.next_body()
    # The view's thread (authentication, the session lookup) and the one the
    # stream borrowed to read the log's bounds are one and the same, idle again.
    assert pool.idle == 1

    # Another request runs on that very thread while the stream stays open.
    status, body = await asgi_get(
        application,
        f"/v1/sessions/{session_id}",
        headers=[(b"x-forwarded-email", b"alice@example.com")],
    )
    assert status == 200, body
    await database_sync_to_async(_record)(session_id, 1)
    assert b"event: test.event" in await call.next_body()

    await call.disconnect()
    assert pool.idle == 1
    assert pool.created == 1
