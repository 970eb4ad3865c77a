"""A session list resumes on another server process (``sessions/updates.py``): the
list log is in the database, so a list opened on one process and resumed on the other
gets what changed while it was away, written on either, without a resync."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.processes import Server, StreamEvent, StreamReader, create_session

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

UPDATES = "/v1/sessions/updates"


def _session_of(event: StreamEvent) -> str:
    return str(event.data.get("session_id") or event.data["session"]["id"])


def test_a_list_resumed_on_the_other_process_gets_what_it_missed(
    two_servers: tuple[Server, Server], make_bundle: Callable[..., bytes]
) -> None:
    first, second = two_servers
    doomed = create_session(second, make_bundle(), title="doomed")
    watching = StreamReader(first, path=UPDATES, until=lambda e: e.type == "session.added")
    watching.wait_for(lambda e: e.type == "session.heartbeat")
    kept = create_session(second, make_bundle(), title="kept")  # written on the other process
    (added,) = [event for event in watching.wait() if event.type == "session.added"]
    assert _session_of(added) == kept and added.id is not None

    # Away: changes through both processes.
    with first.client() as client:
        assert client.patch(f"/v1/sessions/{kept}", json={"title": "renamed"}).status_code == 200
    fresh = create_session(first, make_bundle(), title="fresh")
    with second.client() as client:
        assert client.delete(f"/v1/sessions/{doomed}").status_code == 200

    resumed = StreamReader(
        second,
        path=UPDATES,
        last_event_id=added.id,
        until=lambda e: e.type == "session.removed",
    )
    events = [event for event in resumed.wait() if event.type != "session.heartbeat"]
    assert [(event.type, _session_of(event)) for event in events] == [
        ("session.updated", kept),
        ("session.added", fresh),
        ("session.removed", doomed),
    ]
    assert events[0].data["session"]["title"] == "renamed"
    ids = [event.id for event in events]
    assert all(isinstance(i, int) and i > added.id for i in ids) and ids == sorted(ids)
