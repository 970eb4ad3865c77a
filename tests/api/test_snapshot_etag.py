"""The session snapshot's ETag, 304 and per-process body cache (issue 14: pollers).

``GET /v1/sessions/{id}`` answers JSON with a strong ETag computed from the rows the
permission check loaded; ``If-None-Match`` naming it gets 304 before the items and open
questions are read, and a poller without it gets the kept bytes. Every change a client
can see in the snapshot must change the ETag: each test below makes one, through the
services the app uses, and checks that it did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from omnigent_runner import protocol
from omnigent_site.users import get_or_create_user
from runners import runner_events, scheduler
from runners import services as runner_services
from runners.models import Runner
from sessions import approvals, selectors, shapes, snapshot_cache
from sessions.models import Agent, Approval, Item, Session, Turn
from sessions.shapes import SessionOut, SessionRowOut
from sessions.snapshot_cache import BodyCache

from .conftest import ALICE, BOB, CAROL, DAVE, ask

pytestmark = pytest.mark.django_db

ITEMS_TABLE = Item._meta.db_table
APPROVALS_TABLE = Approval._meta.db_table
USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    snapshot_cache.clear()
    yield
    snapshot_cache.clear()


def url(session_id: str, query: str = "") -> str:
    return f"/v1/sessions/{session_id}{query}"


def get(client: Any, session_id: str, *, query: str = "", **headers: str) -> Any:
    return client.get(url(session_id, query), **headers)


def etag_of(client: Any, session_id: str, *, query: str = "") -> str:
    response = get(client, session_id, query=query)
    assert response.status_code == 200, response.content
    return str(response["ETag"])


def snapshot_sql(run: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``run()``'s result and the SQL it sent."""
    with CaptureQueriesContext(connection) as captured:
        result = run()
    return result, [query["sql"] for query in captured.captured_queries]


def reads_transcript(sql: list[str]) -> bool:
    return any(ITEMS_TABLE in query or APPROVALS_TABLE in query for query in sql)


def online_runner(runner_id: str = "runner_token_etag") -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id=runner_id,
        name="laptop",
        owner=get_or_create_user(ALICE),
        channel_name=f"specific.{runner_id}!x",
        connected_at=now,
        last_seen_at=now,
        generation=1,
    )


def message(session_id: str) -> Turn:
    _item, turn = runner_events.accept_message(
        session_id=session_id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    return turn


# --- the validator ----------------------------------------------------------------------


def test_the_etag_is_strong_stable_and_revalidated(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    first, second = get(alice, session_id), get(alice, session_id)
    assert first.status_code == second.status_code == 200
    etag = first["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 10
    assert second["ETag"] == etag
    assert first["Cache-Control"] == second["Cache-Control"] == "private, no-cache"
    assert first.content == second.content
    assert first["Content-Type"] == second["Content-Type"] == "application/json"
    assert "Accept" in first["Vary"]


def test_if_none_match_answers_304_without_reading_the_transcript(
    client_for, create_session
) -> None:
    session_id = create_session(ALICE)
    message(session_id)
    alice = client_for(ALICE)
    etag = etag_of(alice, session_id)
    snapshot_cache.clear()  # so the 200 below renders and the counts compare fairly
    full, full_sql = snapshot_sql(lambda: get(alice, session_id))
    assert full.status_code == 200 and reads_transcript(full_sql)
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        response, sql = snapshot_sql(partial(get, alice, session_id, HTTP_IF_NONE_MATCH=header))
        assert response.status_code == 304, header
        assert response.content == b""
        assert response["ETag"] == etag
        assert response["Cache-Control"] == "private, no-cache"
        assert not reads_transcript(sql), sql
        assert len(sql) < len(full_sql)
    for header in ('"other"', "garbage", etag.strip('"')):
        response = get(alice, session_id, HTTP_IF_NONE_MATCH=header)
        assert response.status_code == 200, header
        assert response["ETag"] == etag


def test_the_kept_body_skips_the_reads_and_equals_a_fresh_one(client_for, create_session) -> None:
    session_id = create_session(ALICE, title="kept", labels={"team": "core"})
    turn = message(session_id)
    ask(session_id, turn=turn)
    alice = client_for(ALICE)
    filled, filled_sql = snapshot_sql(lambda: get(alice, session_id))
    assert reads_transcript(filled_sql)
    kept, kept_sql = snapshot_sql(lambda: get(alice, session_id))
    assert kept.status_code == 200 and not reads_transcript(kept_sql), kept_sql
    with override_settings(OMNIGENT_SNAPSHOT_CACHE_ENTRIES=0):
        snapshot_cache.clear()
        fresh, fresh_sql = snapshot_sql(lambda: get(alice, session_id))
        assert reads_transcript(fresh_sql)
        assert snapshot_cache._bodies.stats() == (0, 0), "off keeps nothing"
    assert kept.content == filled.content == fresh.content
    assert kept["ETag"] == fresh["ETag"]
    body = json.loads(kept.content)
    assert len(body["items"]) == 1 and body["pending_elicitations_count"] == 1


def test_each_representation_has_its_own_etag_and_bytes(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    message(session_id)
    alice = client_for(ALICE)
    plain = get(alice, session_id)
    indented = get(alice, session_id, HTTP_ACCEPT="application/json; indent=2")
    assert plain["ETag"] != indented["ETag"]
    assert b"\n  " in indented.content and plain.content.count(b"\n") == 1  # the final one
    without = get(alice, session_id, query="?include_items=false")
    assert without["ETag"] != plain["ETag"]
    assert json.loads(without.content)["items"] == []
    again = get(alice, session_id, HTTP_ACCEPT="application/json; indent=2")
    assert again.content == indented.content


def test_the_browsable_page_still_renders(client_for, create_session) -> None:
    session_id = create_session(ALICE, title="in a browser")
    response = get(client_for(ALICE), session_id, HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"in a browser" in response.content
    assert "ETag" not in response


def test_levels_differ_and_equal_levels_share(client_for, create_session, grant) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    grant(session_id, DAVE, 1)
    grant(session_id, CAROL, 2)
    tags = {user: etag_of(client_for(user), session_id) for user in (ALICE, BOB, CAROL, DAVE)}
    assert tags[BOB] == tags[DAVE]
    assert len({tags[ALICE], tags[BOB], tags[CAROL]}) == 3
    bob = get(client_for(BOB), session_id)
    dave = get(client_for(DAVE), session_id)
    assert bob.content == dave.content
    assert json.loads(bob.content)["permission_level"] == 1
    grant(session_id, BOB, 3)
    raised = get(client_for(BOB), session_id, HTTP_IF_NONE_MATCH=tags[BOB])
    assert raised.status_code == 200 and json.loads(raised.content)["permission_level"] == 3


# --- every visible change changes it ----------------------------------------------------


def test_a_message_and_runner_output_change_it(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    runner = online_runner()
    assert alice.patch(url(session_id), {"runner_id": runner.id}, format="json").status_code == 200
    before = etag_of(alice, session_id)
    turn = message(session_id)
    after_message = get(alice, session_id, HTTP_IF_NONE_MATCH=before)
    assert after_message.status_code == 200
    assert len(json.loads(after_message.content)["items"]) == 1
    runner_events.record(
        runner_id=runner.id,
        session_id=session_id,
        events=[
            (
                1,
                protocol.OutputItemDone(
                    response_id=turn.id,
                    item={
                        "id": "msg_out",
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "hello"}],
                    },
                ),
            )
        ],
    )
    after_output = get(alice, session_id, HTTP_IF_NONE_MATCH=after_message["ETag"])
    assert after_output.status_code == 200
    assert [item["id"] for item in json.loads(after_output.content)["items"]][-1] == "msg_out"
    # A text delta changes no stored item but is an event: the validator moves anyway.
    runner_events.record(
        runner_id=runner.id,
        session_id=session_id,
        events=[(2, protocol.OutputTextDelta(response_id=turn.id, item_id="msg_2", delta="x"))],
    )
    assert etag_of(alice, session_id) != after_output["ETag"]


def test_a_queued_turns_place_moving_changes_it(client_for, create_session) -> None:
    """A turn ahead in the runner's queue starts: no write to this session, yet its
    waiting turn's place moves, and so do the ETag and the body."""
    runner = online_runner()
    Runner.objects.filter(pk=runner.pk).update(max_turns=1)
    ahead, behind, running = (create_session(ALICE) for _ in range(3))
    Session.objects.filter(pk__in=[ahead, behind, running]).update(runner=runner)
    alice = client_for(ALICE)
    message(running)
    scheduler.claim()
    message(ahead)
    waiting = message(behind)
    scheduler.claim()
    before = get(alice, behind)
    assert before.json()["queued_turns"] == [{"response_id": waiting.id, "position": 2}]
    # The running turn ends and the one ahead takes its slot.
    Turn.objects.filter(session_id=running).update(status=Turn.Status.COMPLETED)
    scheduler.claim()
    after = get(alice, behind)
    assert after.json()["queued_turns"] == [{"response_id": waiting.id, "position": 1}]
    assert after["ETag"] != before["ETag"]
    assert get(alice, behind, HTTP_IF_NONE_MATCH=before["ETag"]).status_code == 200


def test_approvals_asked_resolved_and_expired_change_it(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    turn = message(session_id)
    seen = [etag_of(alice, session_id)]
    first = ask(session_id, turn=turn, call_id="call_1")
    second = ask(session_id, turn=turn, call_id="call_2")
    asked = get(alice, session_id, HTTP_IF_NONE_MATCH=seen[-1])
    assert asked.status_code == 200
    assert json.loads(asked.content)["pending_elicitations_count"] == 2
    seen.append(asked["ETag"])
    resolved = alice.post(
        f"/v1/sessions/{session_id}/elicitations/{first.id}/resolve",
        {"action": "accept"},
        format="json",
    )
    assert resolved.status_code == 202, resolved.content
    after_resolve = get(alice, session_id, HTTP_IF_NONE_MATCH=seen[-1])
    assert after_resolve.status_code == 200
    assert json.loads(after_resolve.content)["pending_elicitations_count"] == 1
    seen.append(after_resolve["ETag"])
    Approval.objects.filter(pk=second.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert [approval.pk for approval in approvals.expire_due()] == [second.pk]
    after_expiry = get(alice, session_id, HTTP_IF_NONE_MATCH=seen[-1])
    assert after_expiry.status_code == 200
    assert json.loads(after_expiry.content)["pending_elicitations"] == []
    seen.append(after_expiry["ETag"])
    assert len(set(seen)) == 4


def test_patching_title_labels_and_sharing_change_it(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    seen = [etag_of(alice, session_id)]
    for change in ({"title": "renamed"}, {"labels": {"k": "v"}}, {"share_workspace_files": True}):
        assert alice.patch(url(session_id), change, format="json").status_code == 200
        response = get(alice, session_id, HTTP_IF_NONE_MATCH=seen[-1])
        assert response.status_code == 200, change
        body = json.loads(response.content)
        key, value = next(iter(change.items()))
        assert body[key] == value
        seen.append(response["ETag"])
    assert len(set(seen)) == 4


def test_binding_unbinding_and_the_runner_going_offline_change_it(
    client_for, create_session
) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    runner = online_runner()
    seen = [etag_of(alice, session_id)]

    def changed(**expect: Any) -> None:
        response = get(alice, session_id, HTTP_IF_NONE_MATCH=seen[-1])
        assert response.status_code == 200, expect
        body = json.loads(response.content)
        assert {key: body[key] for key in expect} == expect
        seen.append(response["ETag"])

    assert alice.patch(url(session_id), {"runner_id": runner.id}, format="json").status_code == 200
    changed(runner_id=runner.id, runner_online=True)
    runner_services.mark_disconnected(runner_id=runner.id, generation=runner.generation)
    changed(runner_online=False)
    runner_services.mark_connected(
        runner_id=runner.id, channel_name="specific.again!x", runner_version="1", workspace={}
    )
    changed(runner_online=True)
    # No write at all: heartbeats stopped, and the answer turns with the clock.
    Runner.objects.filter(pk=runner.pk).update(last_seen_at=timezone.now() - timedelta(hours=1))
    changed(runner_online=False)
    Runner.objects.filter(pk=runner.pk).update(last_seen_at=timezone.now())
    changed(runner_online=True)
    assert alice.patch(url(session_id), {"runner_id": ""}, format="json").status_code == 200
    changed(runner_id=None, runner_online=True)
    assert alice.patch(url(session_id), {"runner_id": runner.id}, format="json").status_code == 200
    changed(runner_id=runner.id)
    # Deleting the runner unbinds by an UPDATE of the foreign key alone.
    runner.delete()
    changed(runner_id=None)


def test_the_agent_name_changes_it(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    before = etag_of(alice, session_id)
    agent_id = Session.objects.get(pk=session_id).agent_id
    Agent.objects.filter(pk=agent_id).update(name="renamed-agent")
    response = get(alice, session_id, HTTP_IF_NONE_MATCH=before)
    assert response.status_code == 200
    assert json.loads(response.content)["agent_name"] == "renamed-agent"


def test_an_admin_edit_of_an_item_changes_it(client_for, create_session, django_user_model) -> None:
    session_id = create_session(ALICE)
    message(session_id)
    alice = client_for(ALICE)
    before = etag_of(alice, session_id)
    admin = django_user_model.objects.create_superuser(
        username="admin", email="admin@example.com", password="pw-for-admin"
    )
    staff = client_for(None)
    staff.force_login(admin)
    item = Item.objects.get(session_id=session_id)
    delete_url = reverse("admin:agent_sessions_item_delete", args=[quote(item.pk)])
    assert staff.post(delete_url, {"post": "yes"}).status_code == 302
    response = get(alice, session_id, HTTP_IF_NONE_MATCH=before)
    assert response.status_code == 200
    assert json.loads(response.content)["items"] == []


# --- what its input covers -------------------------------------------------------------

# The snapshot's fields outside its row shape: the transcript, the open questions and
# the MCP servers' state, which change only with an event (``session.mcp_status`` is
# stored with the event that reports it), so ``last_event_seq`` stands for them; and the
# queued turns' places, which move with no write to the session (a turn ahead started)
# and are computed into the input while one waits (``selectors.snapshot_etag``); the
# usage totals, which change with the row's ``updated_at`` (``_apply_usage``).
STOOD_FOR_BY_THE_EVENT_SEQUENCE = {"items", "pending_elicitations", "mcp_servers", "usage"}
COMPUTED_INTO_THE_INPUT = {"queued_turns"}


def _keys(shape: Any) -> set[str]:
    return set(shape.__required_keys__ | shape.__optional_keys__)


def test_the_snapshot_is_its_row_plus_what_the_event_sequence_stands_for() -> None:
    """A field added to ``SessionOut`` outside the row would not be in the ETag's input:
    add it to ``session_row`` (covered) or make it change only with an event."""
    assert (
        _keys(SessionOut) - _keys(SessionRowOut)
        == STOOD_FOR_BY_THE_EVENT_SEQUENCE | COMPUTED_INTO_THE_INPUT
    )


@pytest.mark.parametrize("field", sorted(_keys(SessionRowOut)))
def test_every_row_field_is_in_its_input(
    field: str, create_session, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = create_session(ALICE)
    session, level = selectors.session_for(
        session_id=session_id, user=get_or_create_user(ALICE), level=1
    )

    def etag() -> str:
        return selectors.snapshot_etag(session=session, level=level, include_items=True)

    before = etag()
    real = shapes.session_row
    monkeypatch.setattr(
        selectors, "session_row", lambda *args, **kwargs: {**real(*args, **kwargs), field: "x"}
    )
    assert etag() != before


# --- the cache's bounds -----------------------------------------------------------------


def test_the_body_cache_is_bounded_in_entries_and_bytes() -> None:
    cache = BodyCache(max_bytes=100, max_entry_bytes=60)
    for n in range(4):
        cache.put(key=("s", str(n)), body=b"x" * 10, max_entries=3)
    assert cache.stats() == (3, 30)
    assert cache.get(key=("s", "0")) is None
    assert cache.get(key=("s", "1")) == b"x" * 10  # now the most recently used
    cache.put(key=("s", "big"), body=b"y" * 55, max_entries=3)
    assert cache.get(key=("s", "big")) == b"y" * 55
    assert cache.get(key=("s", "1")) == b"x" * 10, "recently used: kept"
    assert cache.stats() == (3, 75)
    cache.put(key=("s", "other"), body=b"z" * 50, max_entries=3)
    assert cache.stats()[1] <= 100
    assert cache.get(key=("s", "other")) == b"z" * 50
    cache.put(key=("s", "huge"), body=b"h" * 61, max_entries=3)
    assert cache.get(key=("s", "huge")) is None, "over the entry bound: not kept"
    cache.put(key=("s", "off"), body=b"o", max_entries=0)
    assert cache.get(key=("s", "off")) is None
    cache.clear()
    assert cache.stats() == (0, 0)


def test_a_patch_answers_with_the_etag_a_get_gives_for_the_new_state(
    client_for, create_session
) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    before = etag_of(alice, session_id)
    patched = alice.patch(url(session_id), {"title": "renamed"}, format="json")
    assert patched.status_code == 200
    assert patched["ETag"] != before
    assert patched["Cache-Control"] == "private, no-cache"
    fresh = get(alice, session_id)
    assert fresh["ETag"] == patched["ETag"]
    assert json.loads(fresh.content) == json.loads(patched.content)
    # So the caller's next poll of the unchanged session is a 304.
    assert get(alice, session_id, HTTP_IF_NONE_MATCH=patched["ETag"]).status_code == 304
    # Binding a runner: the answer's validator covers the runner too.
    runner = online_runner()
    bound = alice.patch(url(session_id), {"runner_id": runner.id}, format="json")
    assert bound.status_code == 200
    assert get(alice, session_id, HTTP_IF_NONE_MATCH=bound["ETag"]).status_code == 304
    # The browsable API's page gets none, as on GET.
    page = alice.patch(url(session_id), {"title": "again"}, format="json", HTTP_ACCEPT="text/html")
    assert page.status_code == 200 and "ETag" not in page
