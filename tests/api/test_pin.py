"""``PUT``/``DELETE /v1/sessions/{id}/pin``: a session pinned in the caller's own list
(docs/web.md, Sidebar). The pin is per user: it shows as ``pinned`` on that user's list
rows, snapshot and list-stream rows only, never moves ``updated_at``, and is announced to
that user's open lists alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from omnigent_site.users import get_or_create_user
from sessions.models import ListEvent, Permission, Session

from .conftest import ALICE, BOB, CAROL, assert_error

pytestmark = pytest.mark.django_db


def _rows(client: Any, query: str = "") -> dict[str, dict[str, Any]]:
    response = client.get(f"/v1/sessions?limit=100{query}")
    assert response.status_code == 200, response.content
    return {row["id"]: row for row in response.json()["data"]}


def _list_events(user: str, session_id: str) -> int:
    return ListEvent.objects.filter(user=get_or_create_user(user), session_id=session_id).count()


def test_pin_and_unpin_are_per_user_idempotent_and_shown_on_rows(
    client_for: Callable[[str | None], Any],
    create_session: Callable[..., str],
    grant: Callable[..., None],
) -> None:
    pinned = create_session(ALICE, title="pinned")
    other = create_session(ALICE, title="other")
    grant(pinned, BOB, 1)
    alice, bob = client_for(ALICE), client_for(BOB)
    before = Session.objects.get(pk=pinned).updated_at
    alice_events = _list_events(ALICE, pinned)
    bob_events = _list_events(BOB, pinned)

    answer = alice.put(f"/v1/sessions/{pinned}/pin")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"object": "session.pin", "session_id": pinned, "pinned": True}
    # Again: the same answer, nothing written or announced a second time.
    stamp = Permission.objects.get(session_id=pinned, user__username=ALICE).pinned_at
    assert stamp is not None
    assert alice.put(f"/v1/sessions/{pinned}/pin").json()["pinned"] is True
    assert Permission.objects.get(session_id=pinned, user__username=ALICE).pinned_at == stamp
    assert _list_events(ALICE, pinned) == alice_events + 1
    assert _list_events(BOB, pinned) == bob_events  # nobody else's list changed

    rows = _rows(alice)
    assert (rows[pinned]["pinned"], rows[other]["pinned"]) == (True, False)
    assert _rows(bob)[pinned]["pinned"] is False
    assert alice.get(f"/v1/sessions/{pinned}").json()["pinned"] is True
    assert bob.get(f"/v1/sessions/{pinned}").json()["pinned"] is False
    # Pinning is no activity: the list's order by activity does not move.
    assert Session.objects.get(pk=pinned).updated_at == before
    # A search's rows carry it too.
    assert _rows(alice, "&search_query=pinned")[pinned]["pinned"] is True

    # A read grant may pin in its own list.
    assert bob.put(f"/v1/sessions/{pinned}/pin").json()["pinned"] is True
    assert _rows(bob)[pinned]["pinned"] is True

    gone = alice.delete(f"/v1/sessions/{pinned}/pin")
    assert gone.status_code == 200, gone.content
    assert gone.json() == {"object": "session.pin", "session_id": pinned, "pinned": False}
    assert alice.delete(f"/v1/sessions/{pinned}/pin").json()["pinned"] is False
    assert _list_events(ALICE, pinned) == alice_events + 2
    assert _rows(alice)[pinned]["pinned"] is False
    assert _rows(bob)[pinned]["pinned"] is True


def test_the_snapshot_etag_changes_with_the_pin(
    client_for: Callable[[str | None], Any], create_session: Callable[..., str]
) -> None:
    session_id = create_session(ALICE)
    alice = client_for(ALICE)
    first = alice.get(f"/v1/sessions/{session_id}")["ETag"]
    alice.put(f"/v1/sessions/{session_id}/pin")
    again = alice.get(f"/v1/sessions/{session_id}", HTTP_IF_NONE_MATCH=first)
    assert again.status_code == 200 and again.json()["pinned"] is True


def test_others_sessions_are_not_found_and_anonymous_callers_are_refused(
    client_for: Callable[[str | None], Any], create_session: Callable[..., str]
) -> None:
    session_id = create_session(ALICE)
    for method in ("put", "delete"):
        answer = getattr(client_for(CAROL), method)(f"/v1/sessions/{session_id}/pin")
        assert_error(answer, 404, "not_found", mentions=session_id)
        missing = getattr(client_for(ALICE), method)("/v1/sessions/conv_nope/pin")
        assert_error(missing, 404, "not_found")
        anonymous = getattr(client_for(None), method)(f"/v1/sessions/{session_id}/pin")
        assert anonymous.status_code == 401, anonymous.content
    assert not Permission.objects.filter(pinned_at__isnull=False).exists()


def test_an_admin_without_a_grant_has_nothing_to_pin(
    client_for: Callable[[str | None], Any],
    create_session: Callable[..., str],
    django_user_model: Any,
) -> None:
    session_id = create_session(ALICE)
    django_user_model.objects.create_user(username="root@example.com", is_staff=True)
    answer = client_for("root@example.com").put(f"/v1/sessions/{session_id}/pin")
    assert_error(answer, 403, "forbidden", mentions="your own list")
    assert not Permission.objects.filter(pinned_at__isnull=False).exists()


def test_other_methods_get_the_error_format(
    client_for: Callable[[str | None], Any], create_session: Callable[..., str]
) -> None:
    session_id = create_session(ALICE)
    answer = client_for(ALICE).post(f"/v1/sessions/{session_id}/pin", {}, format="json")
    assert_error(answer, 405, "method_not_allowed")


def test_the_list_filters_by_the_callers_pins(
    client_for: Callable[[str | None], Any],
    create_session: Callable[..., str],
    grant: Callable[..., None],
) -> None:
    """``?pinned=1`` lists only the caller's pinned sessions (the sidebar reads them apart
    from the newest), ``0`` only the others; another user's pin does not count."""
    mine, theirs, plain = (create_session(ALICE, title=t) for t in ("mine", "theirs", "plain"))
    grant(theirs, BOB, 1)
    alice, bob = client_for(ALICE), client_for(BOB)
    alice.put(f"/v1/sessions/{mine}/pin")
    bob.put(f"/v1/sessions/{theirs}/pin")
    assert set(_rows(alice, "&pinned=1")) == {mine}
    assert set(_rows(alice, "&pinned=true")) == {mine}
    assert set(_rows(alice, "&pinned=0")) == {theirs, plain}
    assert set(_rows(alice)) == {mine, theirs, plain}
    assert set(_rows(bob, "&pinned=1")) == {theirs}
    # With the other filters: an archived pin is listed under archived only.
    alice.patch(f"/v1/sessions/{mine}", {"archived": True}, format="json")
    assert set(_rows(alice, "&pinned=1")) == set()
    assert set(_rows(alice, "&pinned=1&archived=1")) == {mine}
    error = assert_error(alice.get("/v1/sessions?pinned=yes"), 400, "invalid_input")
    assert "pinned" in error.get("fields", {}), error
