"""``GET /v1/sessions/updates`` at the ASGI level: who hears what, resume, heartbeat.

The writes go through the services (the real publishers); the stream is read through
``omnigent_site.asgi.application`` with the in-memory channel layer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core.cache import caches
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from omnigent_site.asgi import application
from omnigent_site.runtime.shutdown import stopping
from omnigent_site.users import get_or_create_user
from runners import services as runner_services
from sessions import list_log, list_watch, services
from sessions.fork import fork_session
from sessions.models import ListEvent, Session
from sessions.services import create_session_from_bundle

from .asgi_http import http_scope

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

ALICE, BOB = "alice@example.com", "bob@example.com"


class UpdatesCall:
    """One open ``/v1/sessions/updates`` request; ``events()`` parses what arrives."""

    def __init__(self, user: str, *, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        scope = http_scope(
            "/v1/sessions/updates",
            headers=[(b"x-forwarded-email", user.encode()), *(headers or [])],
        )
        self.incoming.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        self.task = asyncio.ensure_future(application(scope, self.incoming.get, self.sent.put))
        self.buffer = b""

    async def start(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.sent.get(), timeout=10)
        assert message["type"] == "http.response.start"
        return message

    async def next_event(self) -> tuple[int | None, dict[str, Any]]:
        while b"\n\n" not in self.buffer:
            message = await asyncio.wait_for(self.sent.get(), timeout=10)
            if message["type"] == "http.response.body":
                self.buffer += bytes(message.get("body", b""))
        block, self.buffer = self.buffer.split(b"\n\n", 1)
        event_id = None
        data = b""
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                event_id = int(line[4:])
            elif line.startswith(b"data: "):
                data = line[6:]
        return event_id, json.loads(data)

    async def next_of(self, *types: str) -> tuple[int | None, dict[str, Any]]:
        """The next event of these types (heartbeats in between are skipped)."""
        while True:
            event_id, event = await self.next_event()
            if event["type"] in types:
                return event_id, event

    async def disconnect(self) -> None:
        await self.incoming.put({"type": "http.disconnect"})
        await asyncio.wait_for(self.task, timeout=10)


def _create(make_bundle: Any, *, title: str) -> str:
    user = get_or_create_user(ALICE)
    return create_session_from_bundle(user=user, data=make_bundle(), title=title).id


async def test_a_list_hears_create_update_grant_revoke_and_delete(make_bundle: Any) -> None:
    await database_sync_to_async(get_or_create_user)(BOB)
    alice, bob = UpdatesCall(ALICE), UpdatesCall(BOB)
    for call in (alice, bob):
        start = await call.start()
        assert start["status"] == 200
        assert (b"Content-Type", b"text/event-stream") in start["headers"]
        assert (await call.next_event())[1] == {"type": "session.heartbeat"}

    session_id = await database_sync_to_async(_create)(make_bundle, title="first")
    event_id, added = await alice.next_of("session.added")
    assert event_id is not None and event_id > 0
    assert added["session"]["id"] == session_id
    assert added["session"]["title"] == "first"
    assert added["session"]["permission_level"] == 4

    def rename() -> None:
        services.update_session(session=Session.objects.get(pk=session_id), title="renamed")

    await database_sync_to_async(rename)()
    _, updated = await alice.next_of("session.updated")
    assert updated["session"]["title"] == "renamed"

    def share(level: int) -> None:
        session = Session.objects.get(pk=session_id)
        services.grant_permission(
            session=session, actor=get_or_create_user(ALICE), user_id=BOB, level=level
        )

    await database_sync_to_async(share)(1)
    _, bob_added = await bob.next_of("session.added")
    assert bob_added["session"]["id"] == session_id
    assert bob_added["session"]["permission_level"] == 1  # bob's own level, not alice's
    await database_sync_to_async(share)(2)
    _, bob_updated = await bob.next_of("session.updated")
    assert bob_updated["session"]["permission_level"] == 2

    def revoke() -> None:
        services.revoke_permission(session=Session.objects.get(pk=session_id), user_id=BOB)

    await database_sync_to_async(revoke)()
    assert (await bob.next_of("session.removed"))[1] == {
        "type": "session.removed",
        "session_id": session_id,
    }

    def delete() -> None:
        services.delete_session(session=Session.objects.get(pk=session_id))

    await database_sync_to_async(delete)()
    assert (await alice.next_of("session.removed"))[1]["session_id"] == session_id
    # Bob no longer holds a grant: he heard nothing of the delete (only heartbeats, if any).
    assert b"session.removed" not in bob.buffer
    await alice.disconnect()
    await bob.disconnect()


async def test_a_runner_going_offline_updates_each_of_its_rows_read_at_once(
    make_bundle: Any,
) -> None:
    sessions_table = Session._meta.db_table

    def setup() -> tuple[str, int, list[str]]:
        alice = get_or_create_user(ALICE)
        get_or_create_user(BOB)
        runner, _token = runner_services.register_runner(owner=alice, name="laptop")
        generation = runner_services.mark_connected(
            runner_id=runner.id, channel_name="test.runner", runner_version="t", workspace={}
        ).generation
        ids = [_create(make_bundle, title=f"s{i}") for i in range(3)]
        services.grant_permission(
            session=Session.objects.get(pk=ids[0]), actor=alice, user_id=BOB, level=1
        )
        Session.objects.filter(pk__in=ids).update(runner=runner)
        return runner.id, generation, ids

    runner_id, generation, ids = await database_sync_to_async(setup)()
    alice, bob = UpdatesCall(ALICE), UpdatesCall(BOB)
    for call in (alice, bob):
        await call.start()
        assert (await call.next_event())[1] == {"type": "session.heartbeat"}

    def go_offline() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            assert runner_services.mark_disconnected(runner_id=runner_id, generation=generation)
        return [query["sql"] for query in queries.captured_queries]

    statements = await database_sync_to_async(go_offline)()
    # One read of the rows for the three sessions (and their grantees), not one each;
    # and the list log written in a fixed number of statements, not one per session.
    reads = [sql for sql in statements if "grantee_pk" in sql and sessions_table in sql]
    assert len(reads) == 1, statements
    logged = [sql for sql in statements if ListEvent._meta.db_table in sql]
    assert len(logged) == 1 and logged[0].startswith("INSERT"), statements
    heard = [(await alice.next_of("session.updated"))[1]["session"] for _ in ids]
    assert sorted(row["id"] for row in heard) == sorted(ids)
    assert all(row["runner_id"] == runner_id and not row["runner_online"] for row in heard)
    assert {row["permission_level"] for row in heard} == {4}
    _, bobs = await bob.next_of("session.updated")
    assert (bobs["session"]["id"], bobs["session"]["permission_level"]) == (ids[0], 1)
    assert not bobs["session"]["runner_online"]
    await alice.disconnect()
    await bob.disconnect()


async def test_a_fork_appears_in_the_forking_users_list(make_bundle: Any) -> None:
    session_id = await database_sync_to_async(_create)(make_bundle, title="source")
    alice = UpdatesCall(ALICE)
    assert (await alice.start())["status"] == 200
    # Everything written after the first frame is delivered (sessions/updates.py).
    assert (await alice.next_event())[1] == {"type": "session.heartbeat"}

    def fork() -> str:
        source = Session.objects.get(pk=session_id)
        return fork_session(source=source, user=get_or_create_user(ALICE)).id

    fork_id = await database_sync_to_async(fork)()
    _, added = await alice.next_of("session.added")
    assert added["session"]["id"] == fork_id
    assert added["session"]["title"] == "Fork of source"
    await alice.disconnect()


async def test_a_resumed_list_gets_what_it_missed_then_the_live_tail(make_bundle: Any) -> None:
    """While the list was away: a rename, a new session, a delete, a session shared with
    the user and one of its grants taken back. The resume gets each session's row as it
    is now (or its removal), numbered and ordered by its newest change; no resync."""

    def setup() -> tuple[str, str]:
        get_or_create_user(BOB)
        return _create(make_bundle, title="kept"), _create(make_bundle, title="doomed")

    kept, doomed = await database_sync_to_async(setup)()
    alice = UpdatesCall(ALICE)
    await alice.start()
    await alice.next_event()
    seen = await database_sync_to_async(_create)(make_bundle, title="seen")
    last_id, _ = await alice.next_of("session.added")
    assert last_id is not None
    await alice.disconnect()

    def while_away() -> tuple[str, str]:
        alice_user, bob_user = get_or_create_user(ALICE), get_or_create_user(BOB)
        services.update_session(session=Session.objects.get(pk=kept), title="renamed")
        services.update_session(session=Session.objects.get(pk=kept), title="renamed twice")
        new = _create(make_bundle, title="new")
        services.delete_session(session=Session.objects.get(pk=doomed))
        bobs = create_session_from_bundle(user=bob_user, data=make_bundle(), title="bob's").id
        services.grant_permission(
            session=Session.objects.get(pk=bobs), actor=bob_user, user_id=ALICE, level=2
        )
        services.grant_permission(
            session=Session.objects.get(pk=seen), actor=alice_user, user_id=BOB, level=1
        )
        return new, bobs

    new, bobs = await database_sync_to_async(while_away)()
    again = UpdatesCall(ALICE, headers=[(b"last-event-id", str(last_id).encode())])
    await again.start()
    assert (await again.next_event())[1] == {"type": "session.heartbeat"}
    missed = [await again.next_event() for _ in range(4)]
    ids = [event_id for event_id, _ in missed]
    assert all(event_id is not None for event_id in ids) and ids == sorted(ids)
    assert ids[0] > last_id
    assert [
        (event["type"], event.get("session", {}).get("id") or event.get("session_id"))
        for _, event in missed
    ] == [
        ("session.updated", kept),
        ("session.added", new),
        ("session.removed", doomed),
        ("session.added", bobs),
    ]
    assert missed[0][1]["session"]["title"] == "renamed twice"  # as it is now
    assert missed[3][1]["session"]["permission_level"] == 2
    # Bob's grant on "seen" changed no row of Alice's list: nothing about it.
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(again.next_of("session.added", "session.updated"), timeout=0.3)
    # Then the live tail, numbered on from there.
    latest = await database_sync_to_async(_create)(make_bundle, title="live")
    live_id, live = await again.next_of("session.added")
    assert live["session"]["id"] == latest and live_id == ids[-1] + 1
    await again.disconnect()


async def test_resuming_where_the_list_left_sends_nothing_again(make_bundle: Any) -> None:
    alice = UpdatesCall(ALICE)
    await alice.start()
    await alice.next_event()
    await database_sync_to_async(_create)(make_bundle, title="one")
    last_id, _ = await alice.next_of("session.added")
    await alice.disconnect()
    again = UpdatesCall(ALICE, headers=[(b"last-event-id", str(last_id).encode())])
    await again.start()
    assert (await again.next_event())[1] == {"type": "session.heartbeat"}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(again.next_event(), timeout=0.3)
    await again.disconnect()


async def test_a_resume_point_the_log_no_longer_reaches_answers_resync(
    make_bundle: Any, settings: Any
) -> None:
    """Past the retention (count and age both), an old point answers ``session.resync``,
    numbered with the newest event, and the live tail follows; so do a point the log
    never had (the old millisecond ids) and one from before any pruning of another user."""
    settings.OMNIGENT_LIST_EVENT_RETENTION = 5
    settings.OMNIGENT_LIST_EVENT_RETENTION_S = 0

    def churn() -> int:
        session = Session.objects.get(pk=_create(make_bundle, title="busy"))
        for n in range(list_log.PRUNE_EVERY + 5):
            services.update_session(session=session, title=f"busy {n}")
        return list_log.bounds(user_pk=get_or_create_user(ALICE).pk)[0]

    newest = await database_sync_to_async(churn)()
    oldest = await database_sync_to_async(
        lambda: list_log.bounds(user_pk=get_or_create_user(ALICE).pk)[1]
    )()
    assert oldest is not None and 1 < oldest <= newest - 5
    for point in (b"1", b"1700000000000"):
        call = UpdatesCall(ALICE, headers=[(b"last-event-id", point)])
        await call.start()
        assert (await call.next_event())[1] == {"type": "session.heartbeat"}
        assert await call.next_event() == (newest, {"type": "session.resync"})
        await call.disconnect()
    # Still inside what the log keeps: no resync.
    call = UpdatesCall(ALICE, headers=[(b"last-event-id", str(oldest - 1).encode())])
    await call.start()
    await call.next_event()
    event_id, event = await call.next_event()
    assert event["type"] == "session.updated" and event_id == newest
    session_id = await database_sync_to_async(_create)(make_bundle, title="after")
    assert (await call.next_of("session.added"))[1]["session"]["id"] == session_id
    await call.disconnect()


async def test_a_list_event_the_group_did_not_deliver_is_read_back_from_the_log(
    make_bundle: Any,
) -> None:
    """A live frame numbered past the next expected one: the gap is filled first."""
    session_id = await database_sync_to_async(_create)(make_bundle, title="quiet")
    alice = UpdatesCall(ALICE)
    await alice.start()
    await alice.next_event()

    def logged_unannounced() -> None:  # as if its group message had been lost
        with transaction.atomic():
            Session.objects.filter(pk=session_id).update(title="unannounced")
            list_log.record_session(session_id=session_id, kind="updated")

    await database_sync_to_async(logged_unannounced)()
    fresh = await database_sync_to_async(_create)(make_bundle, title="announced")
    (gap_id, gap), (live_id, live) = await alice.next_event(), await alice.next_event()
    assert gap["session"]["id"] == session_id and gap["session"]["title"] == "unannounced"
    assert live["session"]["id"] == fresh and live_id == gap_id + 1
    await alice.disconnect()


async def test_an_idle_list_gets_heartbeats(settings: Any) -> None:
    settings.OMNIGENT_STREAM_HEARTBEAT_S = 0.05
    call = UpdatesCall(ALICE)
    await call.start()
    for _ in range(3):
        event_id, event = await call.next_event()
        assert event == {"type": "session.heartbeat"} and event_id is None
    await call.disconnect()


async def test_another_users_writes_are_not_heard(make_bundle: Any) -> None:
    call = UpdatesCall(BOB)
    await call.start()
    await call.next_event()
    await database_sync_to_async(_create)(make_bundle, title="alice only")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(call.next_of("session.added"), timeout=0.5)
    await call.disconnect()


async def test_the_stream_ends_with_done_when_the_server_stops() -> None:
    call = UpdatesCall(ALICE)
    await call.start()
    await call.next_event()
    stopping().set()  # what the before-shutdown trigger does, for this event loop only
    await asyncio.wait_for(call.task, timeout=10)
    assert (
        call.buffer + b"".join(bytes(m.get("body", b"")) for m in drain(call.sent))
        == b"data: [DONE]\n\n"
    )


def drain(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    messages = []
    while not queue.empty():
        messages.append(queue.get_nowait())
    return messages


# --- list_watch: no list open, no list row read ------------------------------------------


def _renamed_reading_rows(session_id: str, title: str) -> list[str]:
    """Rename the session; the statements that read list rows (with their grantees)."""
    with CaptureQueriesContext(connection) as queries:
        services.update_session(session=Session.objects.get(pk=session_id), title=title)
    return [query["sql"] for query in queries.captured_queries if "grantee_pk" in query["sql"]]


async def test_with_no_list_open_no_row_is_read_and_one_opened_hears_the_next(
    make_bundle: Any,
) -> None:
    session_id = await database_sync_to_async(_create)(make_bundle, title="quiet")
    assert await database_sync_to_async(_renamed_reading_rows)(session_id, "unheard") == []
    alice = UpdatesCall(ALICE)
    await alice.start()
    assert (await alice.next_event())[1] == {"type": "session.heartbeat"}
    assert list_watch.lists_open()
    reads = await database_sync_to_async(_renamed_reading_rows)(session_id, "heard")
    assert len(reads) == 1
    _, updated = await alice.next_of("session.updated")
    assert updated["session"]["title"] == "heard"
    await alice.disconnect()


async def test_a_list_marks_itself_open_again_while_it_stays_open(settings: Any) -> None:
    settings.OMNIGENT_STREAM_HEARTBEAT_S = 0.05
    await database_sync_to_async(get_or_create_user)(ALICE)
    alice = UpdatesCall(ALICE)
    await alice.start()
    assert (await alice.next_event())[1] == {"type": "session.heartbeat"}
    assert list_watch.mark_ttl_s() == pytest.approx(0.2)
    caches["presence"].delete(list_watch.LISTS_OPEN_KEY)  # as if its mark had run out
    assert not list_watch.lists_open()
    for _ in range(3):  # each heartbeat interval, a batch: the mark is made again
        assert (await alice.next_event())[1] == {"type": "session.heartbeat"}
    assert list_watch.lists_open()
    await alice.disconnect()


async def test_a_failing_presence_cache_counts_as_a_list_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("cache down")

    monkeypatch.setattr(caches["presence"], "get", down)
    monkeypatch.setattr(caches["presence"], "aset", down)
    assert list_watch.lists_open()
    await list_watch.mark_list_open()  # logged, not raised: the stream is served anyway


@pytest.mark.redis
async def test_with_redis_a_list_open_in_one_process_is_seen_by_every_other(
    settings: Any,
) -> None:
    from tests.conftest import on_redis

    with on_redis(settings, "presence") as (prefix, store):
        assert not list_watch.lists_open()
        await list_watch.mark_list_open()
        [key] = store.keys(f"{prefix}:*")
        assert 0 < store.ttl(key) <= list_watch.mark_ttl_s()
        assert list_watch.lists_open()
