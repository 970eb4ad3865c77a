"""The list row in plain SQL (``session_list_rows`` and its batch and runner variants)
agrees with the list endpoint's ORM query (``sessions_granted_to``).

The raw SQL exists for speed (the session-list stream reads it after every status
change); the ORM query is what ``GET /v1/sessions`` pages through. Two definitions of
"the sessions a user has in their list, as their rows show them" must not drift: on a
varied fixture (owner, shared at each level, revoked, deleted, bound to a runner online
or not, open and answered questions, pinned by one grantee, an admin without a grant),
every user's rendered rows are the same both ways. CI runs this folder on PostgreSQL too.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from omnigent_site.users import get_or_create_user
from runners import runner_events
from runners.models import Runner
from sessions import selectors
from sessions.models import Approval, Session
from sessions.shapes import session_row

from .conftest import ALICE, BOB, CAROL, DAVE, ask

pytestmark = pytest.mark.django_db

ROOT = "root@example.com"
USERS = (ALICE, BOB, CAROL, DAVE, ROOT)
USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def _runner(runner_id: str) -> Runner:
    now = timezone.now()
    return Runner.objects.create(
        id=runner_id,
        name=runner_id,
        owner=get_or_create_user(ALICE),
        channel_name=f"specific.{runner_id}!x",
        connected_at=now,
        last_seen_at=now,
        generation=1,
    )


def _ask(session_id: str, call_id: str) -> Approval:
    """A message starts a turn; the runner asks about one of its calls."""
    _item, turn = runner_events.accept_message(
        session_id=session_id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    return ask(session_id, turn=turn, call_id=call_id)


@pytest.fixture
def fixture(client_for, create_session, grant) -> dict[str, str]:
    """Sessions in every state a list row can show; returns them by name."""
    admin = get_or_create_user(ROOT)
    admin.is_superuser = True
    admin.save(update_fields=["is_superuser"])
    alice = client_for(ALICE)
    made = {
        "private": create_session(ALICE, title="private"),
        "shared": create_session(ALICE, title="shared", labels={"team": "core"}),
        "revoked": create_session(ALICE),
        "deleted": create_session(ALICE),
        "bobs": create_session(BOB, name="other-agent"),
        "online": create_session(ALICE),
        "offline": create_session(ALICE),
        "asked": create_session(ALICE),
    }
    grant(made["shared"], BOB, 1)
    grant(made["shared"], CAROL, 2)
    grant(made["shared"], DAVE, 3)
    grant(made["revoked"], BOB, 2)
    grant(made["deleted"], CAROL, 1)
    grant(made["bobs"], ALICE, 1, by=BOB)
    grant(made["asked"], CAROL, 1)
    revoked = alice.delete(f"/v1/sessions/{made['revoked']}/permissions/{BOB}")
    assert revoked.status_code in (200, 204), revoked.content
    assert alice.delete(f"/v1/sessions/{made['deleted']}").status_code in (200, 204)
    for name in ("online", "offline"):
        runner = _runner(f"runner_{name}")
        bound = alice.patch(f"/v1/sessions/{made[name]}", {"runner_id": runner.id}, format="json")
        assert bound.status_code == 200, bound.content
    # Heartbeats stopped an hour ago: offline with no other write.
    Runner.objects.filter(pk="runner_offline").update(
        last_seen_at=timezone.now() - timedelta(hours=1)
    )
    first = _ask(made["asked"], "call_1")
    _ask(made["asked"], "call_2")
    _ask(made["asked"], "call_3")
    question = Approval.objects.get(session_id=made["asked"], call_id=first.call_id)
    resolved = alice.post(
        f"/v1/sessions/{made['asked']}/elicitations/{question.id}/resolve",
        {"action": "accept"},
        format="json",
    )
    assert resolved.status_code == 202, resolved.content
    Session.objects.filter(pk=made["private"]).update(status=Session.Status.FAILED)
    # Pinned by one grantee only: the pin is the reader's, on their grant.
    for user, name in ((ALICE, "online"), (BOB, "shared")):
        pinned = client_for(user).put(f"/v1/sessions/{made[name]}/pin")
        assert pinned.status_code == 200, pinned.content
    return made


def _orm_rows(user: str) -> dict[str, dict[str, Any]]:
    """What ``GET /v1/sessions`` renders for the user, by session id."""
    person = get_or_create_user(user)
    found = list(selectors.sessions_granted_to(user=person))
    levels = selectors.grant_levels(user=person, session_ids=[s.id for s in found])
    return {s.id: dict(session_row(s, level=levels[s.id])) for s in found}


def _rendered(found: list[tuple[int, int, Session]]) -> set[tuple[int, str, str]]:
    return {
        (user_pk, row.id, repr(sorted(session_row(row, level=level).items())))
        for user_pk, level, row in found
    }


def _every_user() -> dict[str, dict[str, dict[str, Any]]]:
    return {user: _orm_rows(user) for user in USERS}


def test_the_fixture_has_what_it_claims(fixture: dict[str, str]) -> None:
    orm = _every_user()
    assert set(orm[ALICE]) == {v for k, v in fixture.items() if k not in {"deleted"}}
    assert set(orm[BOB]) == {fixture["shared"], fixture["bobs"]}
    assert set(orm[CAROL]) == {fixture["shared"], fixture["asked"]}
    assert orm[ROOT] == {}
    assert orm[ALICE][fixture["asked"]]["pending_elicitations_count"] == 2
    assert orm[ALICE][fixture["online"]]["runner_online"] is True
    assert orm[ALICE][fixture["offline"]]["runner_online"] is False
    assert orm[DAVE][fixture["shared"]]["permission_level"] == 3
    assert orm[ALICE][fixture["online"]]["pinned"] is True
    assert orm[BOB][fixture["shared"]]["pinned"] is True
    assert orm[ALICE][fixture["shared"]]["pinned"] is False


@pytest.mark.parametrize("user", USERS)
def test_one_users_rows_agree(fixture: dict[str, str], user: str) -> None:
    orm = _orm_rows(user)
    person = get_or_create_user(user)
    raw: dict[str, dict[str, Any]] = {}
    for session_id in fixture.values():
        for user_pk, level, row in selectors.session_list_rows(
            session_id=session_id, user_pk=person.pk
        ):
            assert user_pk == person.pk
            raw[row.id] = dict(session_row(row, level=level))
    assert raw == orm
    batch = selectors.user_session_list_rows(user_pk=person.pk, session_ids=list(fixture.values()))
    assert {sid: dict(session_row(row, level=level)) for sid, (level, row) in batch.items()} == orm


def test_every_grantees_rows_agree(fixture: dict[str, str]) -> None:
    """Without ``user_pk``: one row per grantee, as each grantee's list shows it."""
    pks = {user: get_or_create_user(user).pk for user in USERS}
    expected = {
        (pks[user], session_id, repr(sorted(row.items())))
        for user, rows in _every_user().items()
        for session_id, row in rows.items()
    }
    found: set[tuple[int, str, str]] = set()
    for session_id in fixture.values():
        found |= _rendered(selectors.session_list_rows(session_id=session_id))
    assert found == expected


@pytest.mark.parametrize("name", ["online", "offline"])
def test_a_runners_rows_agree(fixture: dict[str, str], name: str) -> None:
    pks = {user: get_or_create_user(user).pk for user in USERS}
    expected = {
        (pks[user], session_id, repr(sorted(row.items())))
        for user, rows in _every_user().items()
        for session_id, row in rows.items()
        if session_id == fixture[name]
    }
    found = _rendered(selectors.runner_session_list_rows(runner_id=f"runner_{name}"))
    assert found == expected and expected


def test_the_comparison_sees_a_difference(
    fixture: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw query that drops the open-question count would be caught."""
    real: Callable[..., Any] = selectors.rows

    def without_count(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        for row in found:
            row.pending_elicitations_count = 0
        return found

    monkeypatch.setattr(selectors, "rows", without_count)
    raw = selectors.session_list_rows(session_id=fixture["asked"], user_pk=None)
    orm = _every_user()
    user_of = {get_or_create_user(user).pk: user for user in USERS}
    assert raw and all(
        dict(session_row(row, level=level)) != orm[user_of[pk]][row.id] for pk, level, row in raw
    )
