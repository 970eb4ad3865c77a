"""The permission matrix: read=1 < edit=2 < manage=3 < owner=4, admins pass everything,
strangers get 404 and too little access gets 403 naming the level (http-api.md)."""

from __future__ import annotations

import pytest

from sessions.models import Item, Permission, Session, Turn

from .conftest import ALICE, BOB, CAROL, DAVE, assert_error

pytestmark = pytest.mark.django_db

ADMIN = "root@example.com"

# Every route of one session: (method, path suffix, JSON body).
ROUTES = [
    ("get", "", None),
    ("patch", "", {"title": "x"}),
    ("delete", "", None),
    ("get", "/items", None),
    ("get", "/agent", None),
    ("get", "/responses", None),
    ("get", "/responses/{response_id}", None),
    ("get", "/permissions", None),
    ("put", "/permissions", {"user_id": DAVE, "level": 1}),
    ("delete", "/permissions/" + CAROL, None),
    ("post", "/events", {"type": "interrupt"}),
    ("get", "/resources/environments/default/changes", None),
]
ROUTE_IDS = [f"{method.upper()} {suffix or '/'}" for method, suffix, _ in ROUTES]


def call(client, method: str, session_id: str, suffix: str, body: object = None):
    path = f"/v1/sessions/{session_id}{suffix}"
    if body is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, body, format="json")


@pytest.fixture
def session_id(create_session, django_user_model) -> str:
    """ALICE's session, with CAROL holding read."""
    session_id = create_session(ALICE, title="alice's")
    carol = django_user_model.objects.create_user(username=CAROL)
    Permission.objects.create(session_id=session_id, user=carol, level=1)
    return session_id


@pytest.fixture
def turn_id(session_id: str) -> str:
    return Turn.objects.create(session_id=session_id, status="completed").id


def state(session_id: str) -> tuple:
    session = Session.objects.filter(pk=session_id).first()
    grants = sorted(
        Permission.objects.filter(session_id=session_id).values_list("user__username", "level")
    )
    return (session.title if session else None, grants)


@pytest.mark.parametrize(("method", "suffix", "body"), ROUTES, ids=ROUTE_IDS)
def test_anonymous_is_401_on_every_route(
    client_for, settings, session_id, turn_id, method, suffix, body
) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = False
    before = state(session_id)
    response = call(client_for(None), method, session_id, suffix.format(response_id=turn_id), body)
    assert_error(response, 401, "unauthorized")
    assert state(session_id) == before


@pytest.mark.parametrize(("method", "suffix", "body"), ROUTES, ids=ROUTE_IDS)
def test_stranger_is_404_on_every_route(
    client_for, session_id, turn_id, method, suffix, body
) -> None:
    before = state(session_id)
    response = call(client_for(BOB), method, session_id, suffix.format(response_id=turn_id), body)
    error = assert_error(response, 404, "not_found")
    assert session_id in error["message"]
    assert state(session_id) == before


@pytest.mark.parametrize(("method", "suffix", "body"), ROUTES, ids=ROUTE_IDS)
def test_unknown_session_is_404_like_a_strangers(client_for, method, suffix, body) -> None:
    response = call(
        client_for(ALICE), method, "conv_missing", suffix.format(response_id="resp_x"), body
    )
    assert_error(response, 404, "not_found")


# --- read ------------------------------------------------------------------------------


def test_reader_reads_but_cannot_write(client_for, session_id, turn_id) -> None:
    reader = client_for(CAROL)
    snapshot = reader.get(f"/v1/sessions/{session_id}")
    assert snapshot.status_code == 200
    assert snapshot.json()["permission_level"] == 1
    assert reader.get(f"/v1/sessions/{session_id}/items").status_code == 200
    assert reader.get(f"/v1/sessions/{session_id}/agent").status_code == 200
    responses = reader.get(f"/v1/sessions/{session_id}/responses")
    assert [row["id"] for row in responses.json()["data"]] == [turn_id]
    assert reader.get(f"/v1/sessions/{session_id}/responses/{turn_id}").status_code == 200
    changes = reader.get(f"/v1/sessions/{session_id}/resources/environments/default/changes")
    assert changes.status_code == 200

    before = state(session_id)
    response = reader.patch(f"/v1/sessions/{session_id}", {"title": "nope"}, format="json")
    assert_error(response, 403, "forbidden", mentions="edit")
    response = reader.post(
        f"/v1/sessions/{session_id}/events",
        {"type": "message", "data": {"role": "user", "content": "hi"}},
        format="json",
    )
    assert_error(response, 403, "forbidden", mentions="edit")
    assert_error(
        reader.get(f"/v1/sessions/{session_id}/permissions"), 403, "forbidden", mentions="manage"
    )
    response = reader.put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": DAVE, "level": 1}, format="json"
    )
    assert_error(response, 403, "forbidden", mentions="manage")
    response = reader.delete(f"/v1/sessions/{session_id}/permissions/{ALICE}")
    assert_error(response, 403, "forbidden", mentions="manage")
    assert_error(reader.delete(f"/v1/sessions/{session_id}"), 403, "forbidden", mentions="owner")
    assert state(session_id) == before
    assert Item.objects.filter(session_id=session_id).count() == 0


# --- edit ------------------------------------------------------------------------------


def test_editor_patches_but_cannot_manage_or_delete(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 2)
    editor = client_for(BOB)
    response = editor.patch(f"/v1/sessions/{session_id}", {"title": "edited"}, format="json")
    assert response.status_code == 200
    assert response.json()["title"] == "edited"
    assert response.json()["permission_level"] == 2
    assert Session.objects.get(pk=session_id).title == "edited"

    interrupt = editor.post(
        f"/v1/sessions/{session_id}/events", {"type": "interrupt"}, format="json"
    )
    assert interrupt.status_code == 202
    assert interrupt.json() == {"queued": False}

    response = editor.put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": DAVE, "level": 1}, format="json"
    )
    assert_error(response, 403, "forbidden", mentions="manage")
    assert_error(
        editor.get(f"/v1/sessions/{session_id}/permissions"), 403, "forbidden", mentions="manage"
    )
    assert_error(editor.delete(f"/v1/sessions/{session_id}"), 403, "forbidden", mentions="owner")
    assert Session.objects.filter(pk=session_id).exists()
    assert not Permission.objects.filter(session_id=session_id, user__username=DAVE).exists()


def test_editor_cannot_bind_a_runner(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 2)
    response = client_for(BOB).patch(
        f"/v1/sessions/{session_id}", {"runner_id": "runner_token_x"}, format="json"
    )
    assert_error(response, 403, "forbidden", mentions="owner")


# --- manage ----------------------------------------------------------------------------


def test_manager_grants_and_revokes_others(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 3)
    manager = client_for(BOB)
    url = f"/v1/sessions/{session_id}/permissions"
    for level in (1, 2, 3):
        response = manager.put(url, {"user_id": DAVE, "level": level}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["level"] == level
        assert Permission.objects.get(session_id=session_id, user__username=DAVE).level == level

    assert manager.delete(f"{url}/{DAVE}").status_code == 204
    assert manager.delete(f"{url}/{CAROL}").status_code == 204
    assert state(session_id)[1] == [(ALICE, 4), (BOB, 3)]
    assert_error(client_for(CAROL).get(f"/v1/sessions/{session_id}"), 404, "not_found")
    assert_error(manager.delete(f"{url}/{DAVE}"), 404, "not_found")


def test_manager_cannot_change_or_revoke_the_owner(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 3)
    manager = client_for(BOB)
    url = f"/v1/sessions/{session_id}/permissions"
    response = manager.put(url, {"user_id": ALICE, "level": 1}, format="json")
    assert_error(response, 403, "forbidden", mentions="owner")
    assert_error(manager.delete(f"{url}/{ALICE}"), 403, "forbidden", mentions="owner")
    assert Permission.objects.get(session_id=session_id, user__username=ALICE).level == 4


def test_manager_can_revoke_another_manager(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 3)
    grant(session_id, DAVE, 3)
    assert (
        client_for(BOB).delete(f"/v1/sessions/{session_id}/permissions/{DAVE}").status_code == 204
    )
    assert not Permission.objects.filter(session_id=session_id, user__username=DAVE).exists()


# --- owner -----------------------------------------------------------------------------


def test_owner_cannot_be_demoted_revoked_or_leave(client_for, session_id) -> None:
    owner = client_for(ALICE)
    url = f"/v1/sessions/{session_id}/permissions"
    response = owner.put(url, {"user_id": ALICE, "level": 3}, format="json")
    assert_error(response, 403, "forbidden", mentions="your own")
    assert_error(owner.delete(f"{url}/{ALICE}"), 403, "forbidden", mentions="owner")
    assert Permission.objects.get(session_id=session_id, user__username=ALICE).level == 4


def test_put_on_yourself_is_403(client_for, grant, session_id) -> None:
    grant(session_id, BOB, 3)
    response = client_for(BOB).put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": BOB, "level": 1}, format="json"
    )
    assert_error(response, 403, "forbidden")
    assert Permission.objects.get(session_id=session_id, user__username=BOB).level == 3


@pytest.mark.parametrize("level", [0, 4, 5, -1, "x", None, 2.5, True])
def test_levels_outside_1_to_3_are_400(client_for, session_id, level) -> None:
    response = client_for(ALICE).put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": DAVE, "level": level}, format="json"
    )
    error = assert_error(response, 400, "invalid_input", mentions="level")
    assert "level" in error["fields"]
    assert not Permission.objects.filter(session_id=session_id, user__username=DAVE).exists()


@pytest.mark.parametrize(
    "body",
    [{"level": 1}, {"user_id": DAVE}, {"user_id": DAVE, "level": 1, "extra": 1}, {"user_id": ""}],
)
def test_malformed_grant_is_400(client_for, session_id, body) -> None:
    response = client_for(ALICE).put(f"/v1/sessions/{session_id}/permissions", body, format="json")
    assert_error(response, 400, "invalid_input")
    assert state(session_id)[1] == [(ALICE, 4), (CAROL, 1)]


def test_grant_is_an_upsert(client_for, session_id) -> None:
    owner = client_for(ALICE)
    url = f"/v1/sessions/{session_id}/permissions"
    first = owner.put(url, {"user_id": DAVE, "level": 1}, format="json")
    assert first.status_code == 200
    assert first.json() == {
        "user_id": DAVE,
        "conversation_id": session_id,
        "session_id": session_id,
        "level": 1,
    }
    second = owner.put(url, {"user_id": DAVE, "level": 3}, format="json")
    assert second.json() == {**first.json(), "level": 3}
    assert list(
        Permission.objects.filter(session_id=session_id, user__username=DAVE).values_list(
            "level", flat=True
        )
    ) == [3]
    # A grant gives the new user the session (a user seen first through a grant is created).
    assert client_for(DAVE).get(f"/v1/sessions/{session_id}").json()["permission_level"] == 3


def test_reader_can_leave(client_for, session_id) -> None:
    reader = client_for(CAROL)
    response = reader.delete(f"/v1/sessions/{session_id}/permissions/{CAROL}")
    assert response.status_code == 204
    assert response.content == b""
    assert not Permission.objects.filter(session_id=session_id, user__username=CAROL).exists()
    assert_error(reader.get(f"/v1/sessions/{session_id}"), 404, "not_found")
    assert reader.get("/v1/sessions").json()["data"] == []


def test_permission_list_is_ordered_by_user_and_pages(client_for, grant, session_id) -> None:
    for user, level in [("zed@example.com", 2), ("bea@example.com", 3), (DAVE, 1)]:
        grant(session_id, user, level)
    owner = client_for(ALICE)
    url = f"/v1/sessions/{session_id}/permissions"
    body = owner.get(url).json()
    assert body == {
        "permissions": [
            {"user_id": ALICE, "conversation_id": session_id, "level": 4},
            {"user_id": "bea@example.com", "conversation_id": session_id, "level": 3},
            {"user_id": CAROL, "conversation_id": session_id, "level": 1},
            {"user_id": DAVE, "conversation_id": session_id, "level": 1},
            {"user_id": "zed@example.com", "conversation_id": session_id, "level": 2},
        ],
        "next_cursor": None,
    }
    page1 = owner.get(f"{url}?limit=2").json()
    assert [row["user_id"] for row in page1["permissions"]] == [ALICE, "bea@example.com"]
    assert page1["next_cursor"] == "bea@example.com"
    page2 = owner.get(f"{url}?limit=2&after={page1['next_cursor']}").json()
    assert [row["user_id"] for row in page2["permissions"]] == [CAROL, DAVE]
    assert page2["next_cursor"] == DAVE
    page3 = owner.get(f"{url}?limit=2&after={page2['next_cursor']}").json()
    assert [row["user_id"] for row in page3["permissions"]] == ["zed@example.com"]
    assert page3["next_cursor"] is None
    assert_error(owner.get(f"{url}?limit=0"), 400, "invalid_input")

    grant(session_id, BOB, 3)
    manager_view = client_for(BOB).get(url)
    assert manager_view.status_code == 200
    assert len(manager_view.json()["permissions"]) == 6


# --- admin -----------------------------------------------------------------------------


def test_admin_passes_every_check_but_lists_only_own_grants(
    client_for, django_user_model, session_id, turn_id
) -> None:
    django_user_model.objects.create_user(username=ADMIN, is_staff=True)
    admin = client_for(ADMIN)
    snapshot = admin.get(f"/v1/sessions/{session_id}")
    assert snapshot.status_code == 200
    assert snapshot.json()["permission_level"] == 4
    assert admin.get(f"/v1/sessions/{session_id}/items").status_code == 200
    assert admin.get(f"/v1/sessions/{session_id}/responses/{turn_id}").status_code == 200
    assert admin.get(f"/v1/sessions/{session_id}/permissions").status_code == 200
    patched = admin.patch(f"/v1/sessions/{session_id}", {"title": "by admin"}, format="json")
    assert patched.status_code == 200
    assert patched.json()["title"] == "by admin"
    put = admin.put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": DAVE, "level": 2}, format="json"
    )
    assert put.status_code == 200
    assert admin.delete(f"/v1/sessions/{session_id}/permissions/{DAVE}").status_code == 204

    # The list is personal: the admin holds no grant on ALICE's session.
    assert admin.get("/v1/sessions").json()["data"] == []

    deleted = admin.delete(f"/v1/sessions/{session_id}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": session_id, "object": "conversation.deleted", "deleted": True}
    assert not Session.objects.filter(pk=session_id).exists()


def test_superuser_without_staff_is_admin_too(client_for, django_user_model, session_id) -> None:
    django_user_model.objects.create_user(username=ADMIN, is_superuser=True)
    body = client_for(ADMIN).get(f"/v1/sessions/{session_id}").json()
    assert body["permission_level"] == 4
