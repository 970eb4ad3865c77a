"""Sessions: create (multipart and JSON), read, list, update, delete, items, agent,
responses (http-api.md, Sessions and Responses)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from sessions import blobs
from sessions.models import Agent, Item, Permission, Session, SessionEvent, Turn

from .conftest import (
    ALICE,
    BOB,
    assert_error,
    assert_nothing_written,
    stored_files,
    upload,
)

pytestmark = pytest.mark.django_db

BASE_TIME = datetime(2025, 3, 1, tzinfo=UTC)

SESSION_KEYS = {
    "id",
    "object",
    "agent_id",
    "agent_name",
    "status",
    "created_at",
    "updated_at",
    "title",
    "labels",
    "runner_id",
    "runner_name",
    "runner_online",
    "last_task_error",
    "active_response_id",
    "permission_level",
    "pending_elicitations_count",
    "share_workspace_files",
    "archived",
    "pinned",
    "total_cost_usd",
    "budget_usd",
}
# The snapshot adds the transcript, the open questions, the MCP servers' states, the
# queued turns and the usage totals.
SNAPSHOT_KEYS = SESSION_KEYS | {
    "items",
    "pending_elicitations",
    "mcp_servers",
    "queued_turns",
    "usage",
}


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def multipart(client, *, metadata: object = None, bundle: bytes | None = None, **extra):
    data: dict[str, object] = {}
    if metadata is not None:
        data["metadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
    if bundle is not None:
        data["bundle"] = upload(bundle)
    data.update(extra)
    return client.post("/v1/sessions", data, format="multipart")


@pytest.fixture
def template(client_for, make_bundle) -> str:
    response = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(make_bundle("tmpl"))}, format="multipart"
    )
    assert response.status_code == 201
    return response.json()["id"]


# --- multipart create ------------------------------------------------------------------


def test_multipart_create(client_for, make_bundle) -> None:
    data = make_bundle("file-helper")
    response = multipart(
        client_for(ALICE),
        metadata={"title": "Fix the bug", "labels": {"team": "core"}},
        bundle=data,
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"session_id", "agent_id", "agent_name"}
    assert body["session_id"].startswith("conv_")
    assert body["agent_id"].startswith("ag_")
    assert body["agent_name"] == "file-helper"

    session = Session.objects.get(pk=body["session_id"])
    assert session.title == "Fix the bug"
    assert session.labels == {"team": "core"}
    assert session.status == "idle"
    assert session.created_by.username == ALICE
    assert session.agent_id == body["agent_id"]
    assert session.agent.kind == Agent.Kind.SESSION
    grants = list(Permission.objects.filter(session=session).values_list("user__username", "level"))
    assert grants == [(ALICE, 4)]
    assert blobs.read_bundle(session.agent.bundle_sha256) == data


def test_multipart_create_without_metadata(client_for, make_bundle) -> None:
    response = multipart(client_for(ALICE), bundle=make_bundle())
    assert response.status_code == 201
    session = Session.objects.get(pk=response.json()["session_id"])
    assert session.title is None and session.labels == {}


def test_same_bundle_twice_gives_two_private_agents_sharing_one_blob(client_for, make_bundle):
    client = client_for(ALICE)
    first = multipart(client, bundle=make_bundle()).json()
    second = multipart(client, bundle=make_bundle()).json()
    assert first["agent_id"] != second["agent_id"]
    assert len(stored_files()) == 1
    # Deleting one session keeps the blob the other still uses.
    assert client.delete(f"/v1/sessions/{first['session_id']}").status_code == 200
    assert len(stored_files()) == 1
    assert client.delete(f"/v1/sessions/{second['session_id']}").status_code == 200
    assert stored_files() == []


def test_unknown_metadata_key_is_400_and_writes_nothing(client_for, make_bundle) -> None:
    response = multipart(
        client_for(ALICE), metadata={"title": "t", "colour": "red"}, bundle=make_bundle()
    )
    error = assert_error(response, 400, "invalid_input", mentions="colour")
    assert error["fields"] == {"colour": ["unknown field"]}
    assert_nothing_written()


def test_metadata_not_json_is_400(client_for, make_bundle) -> None:
    response = multipart(client_for(ALICE), metadata="{not json", bundle=make_bundle())
    assert_error(response, 400, "invalid_input", mentions="metadata")
    assert_nothing_written()


def test_metadata_not_an_object_is_400(client_for, make_bundle) -> None:
    response = multipart(client_for(ALICE), metadata="[1, 2]", bundle=make_bundle())
    assert_error(response, 400, "invalid_input", mentions="metadata")
    assert_nothing_written()


def test_missing_bundle_part_is_400(client_for) -> None:
    response = multipart(client_for(ALICE), metadata={"title": "t"})
    assert_error(response, 400, "invalid_input", mentions="bundle")
    assert_nothing_written()


def test_bundle_as_a_text_field_is_400(client_for) -> None:
    response = client_for(ALICE).post("/v1/sessions", {"bundle": "text"}, format="multipart")
    assert_error(response, 400, "invalid_input", mentions="bundle")
    assert_nothing_written()


def test_unknown_multipart_part_is_400(client_for, make_bundle) -> None:
    response = multipart(client_for(ALICE), bundle=make_bundle(), extra_part="x")
    assert_error(response, 400, "invalid_input", mentions="extra_part")
    assert_nothing_written()


def test_bad_bundle_is_400_and_writes_nothing(client_for) -> None:
    response = multipart(client_for(ALICE), metadata={"title": "t"}, bundle=b"\x1f\x8bgarbage")
    assert_error(response, 400, "invalid_input", mentions="tar")
    assert_nothing_written()


def test_oversized_bundle_is_413(client_for, make_bundle, settings) -> None:
    settings.OMNIGENT_MAX_BUNDLE_BYTES = 100
    data = make_bundle()
    assert len(data) > 100
    error = assert_error(multipart(client_for(ALICE), bundle=data), 413, "payload_too_large")
    assert "100" in error["message"]
    assert_nothing_written()


def test_other_content_type_is_415(client_for) -> None:
    response = client_for(ALICE).post("/v1/sessions", "hello", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")
    response = client_for(ALICE).post(
        "/v1/sessions", "agent_id=x", content_type="application/x-www-form-urlencoded"
    )
    assert_error(response, 415, "unsupported_media_type")
    assert_nothing_written()


# --- JSON create -----------------------------------------------------------------------


def test_json_create_returns_the_full_session_object(client_for, template) -> None:
    items = [
        {"type": "message", "role": "user", "content": "hello"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi there"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    ]
    response = client_for(ALICE).post(
        "/v1/sessions",
        {"agent_id": template, "title": "JSON", "labels": {"k": "v"}, "initial_items": items},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == SNAPSHOT_KEYS
    assert body["id"].startswith("conv_")
    assert body["object"] == "session"
    assert body["agent_id"] == template
    assert body["agent_name"] == "tmpl"
    assert body["status"] == "idle"
    assert is_int(body["created_at"]) and is_int(body["updated_at"])
    assert body["title"] == "JSON"
    assert body["labels"] == {"k": "v"}
    assert body["runner_id"] is None
    assert body["runner_online"] is True
    assert body["last_task_error"] is None
    assert body["active_response_id"] is None
    assert body["permission_level"] == 4

    nested = body["items"]
    assert [item["type"] for item in nested] == ["message", "message", "function_call"]
    for item in nested:
        assert set(item) == {
            "id",
            "type",
            "status",
            "response_id",
            "created_at",
            "created_by",
            "data",
        }
        assert item["id"].startswith("item_")
        assert item["status"] == "completed"
        assert item["response_id"] is None
        assert is_int(item["created_at"])
    assert nested[0]["data"] == {
        "role": "user",
        "content": [{"type": "input_text", "text": "hello"}],
    }
    assert nested[0]["created_by"] == ALICE
    assert nested[1]["data"] == {
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hi there"}],
    }
    assert nested[1]["created_by"] is None
    assert nested[2]["data"] == {"call_id": "c1", "name": "lookup", "arguments": "{}"}

    # Stored in order.
    stored = list(Item.objects.filter(session_id=body["id"]).order_by("seq"))
    assert [item.id for item in stored] == [item["id"] for item in nested]
    assert [item.type for item in stored] == ["message", "message", "function_call"]
    # The JSON create uses the template itself, not a copy.
    assert Agent.objects.count() == 1


def test_json_create_keeps_given_item_ids(client_for, template) -> None:
    items = [{"id": "item_given", "type": "message", "content": "x"}]
    body = (
        client_for(ALICE)
        .post("/v1/sessions", {"agent_id": template, "initial_items": items}, format="json")
        .json()
    )
    assert [item["id"] for item in body["items"]] == ["item_given"]


def test_json_create_unknown_agent_is_404(client_for) -> None:
    response = client_for(ALICE).post("/v1/sessions", {"agent_id": "ag_nope"}, format="json")
    assert_error(response, 404, "not_found")
    assert Session.objects.count() == 0


def test_json_create_from_someone_elses_session_agent_is_404(client_for, create_session):
    session_id = create_session(ALICE)
    agent_id = Session.objects.get(pk=session_id).agent_id
    response = client_for(BOB).post("/v1/sessions", {"agent_id": agent_id}, format="json")
    assert_error(response, 404, "not_found")
    assert Session.objects.count() == 1


def test_json_create_unknown_key_is_400(client_for, template) -> None:
    response = client_for(ALICE).post(
        "/v1/sessions", {"agent_id": template, "model": "gpt"}, format="json"
    )
    error = assert_error(response, 400, "invalid_input", mentions="model")
    assert error["fields"] == {"model": ["unknown field"]}
    assert Session.objects.count() == 0


def test_json_create_missing_agent_id_is_400(client_for) -> None:
    response = client_for(ALICE).post("/v1/sessions", {"title": "x"}, format="json")
    error = assert_error(response, 400, "invalid_input", mentions="agent_id")
    assert "agent_id" in error["fields"]


# --- read ------------------------------------------------------------------------------


def test_get_session_with_items_and_without(client_for, template) -> None:
    client = client_for(ALICE)
    session_id = client.post(
        "/v1/sessions",
        {"agent_id": template, "initial_items": [{"type": "message", "content": "q"}]},
        format="json",
    ).json()["id"]
    body = client.get(f"/v1/sessions/{session_id}").json()
    assert set(body) == SNAPSHOT_KEYS
    assert len(body["items"]) == 1
    assert body["items"][0]["data"]["content"] == [{"type": "input_text", "text": "q"}]
    assert "content" not in body["items"][0]

    without = client.get(f"/v1/sessions/{session_id}?include_items=false")
    assert without.status_code == 200
    assert without.json()["items"] == []
    assert {k: v for k, v in without.json().items() if k != "items"} == {
        k: v for k, v in body.items() if k != "items"
    }


def test_get_unknown_session_is_404(client_for) -> None:
    assert_error(client_for(ALICE).get("/v1/sessions/conv_missing"), 404, "not_found")


# --- list ------------------------------------------------------------------------------


def _stamp(session_id: str, *, created: int, updated: int) -> None:
    Session.objects.filter(pk=session_id).update(
        created_at=BASE_TIME + timedelta(minutes=created),
        updated_at=BASE_TIME + timedelta(minutes=updated),
    )


def test_list_shows_only_directly_granted_sessions(client_for, create_session, grant) -> None:
    mine = create_session(ALICE, title="mine")
    create_session(BOB, title="bob's private")
    shared = create_session(BOB, title="bob's shared")
    grant(shared, ALICE, 1, by=BOB)
    _stamp(mine, created=0, updated=0)
    _stamp(shared, created=1, updated=1)

    body = client_for(ALICE).get("/v1/sessions").json()
    assert body["object"] == "list"
    assert [row["id"] for row in body["data"]] == [shared, mine]
    assert body["has_more"] is False
    assert body["first_id"] == shared and body["last_id"] == mine
    levels = {row["id"]: row["permission_level"] for row in body["data"]}
    assert levels == {mine: 4, shared: 1}
    for row in body["data"]:
        assert set(row) == SESSION_KEYS
        assert is_int(row["created_at"]) and is_int(row["updated_at"])
    assert body["data"][1]["created_at"] == int(BASE_TIME.timestamp())

    assert client_for("nobody@example.com").get("/v1/sessions").json()["data"] == []


def test_list_filters_by_agent_id_and_name(client_for, create_session) -> None:
    first = create_session(ALICE, name="alpha")
    second = create_session(ALICE, name="beta")
    third = create_session(ALICE, name="alpha")
    for minute, session_id in enumerate([first, second, third]):
        _stamp(session_id, created=minute, updated=minute)
    client = client_for(ALICE)
    second_agent = Session.objects.get(pk=second).agent_id

    by_id = client.get(f"/v1/sessions?agent_id={second_agent}").json()["data"]
    assert [row["id"] for row in by_id] == [second]
    by_name = client.get("/v1/sessions?agent_name=alpha&order=asc").json()["data"]
    assert [row["id"] for row in by_name] == [first, third]
    assert all(row["agent_name"] == "alpha" for row in by_name)
    assert client.get("/v1/sessions?agent_name=gamma").json()["data"] == []


def test_list_sort_by_and_order(client_for, create_session) -> None:
    a = create_session(ALICE)
    b = create_session(ALICE)
    c = create_session(ALICE)
    # Created a, b, c; updated c, a, b.
    _stamp(a, created=0, updated=11)
    _stamp(b, created=1, updated=12)
    _stamp(c, created=2, updated=10)
    client = client_for(ALICE)

    def ids(query: str) -> list[str]:
        response = client.get(f"/v1/sessions?{query}")
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["data"]]

    assert ids("") == [c, b, a]
    assert ids("order=asc") == [a, b, c]
    assert ids("sort_by=created_at&order=desc") == [c, b, a]
    assert ids("sort_by=updated_at") == [b, a, c]
    assert ids("sort_by=updated_at&order=desc") == [b, a, c]
    assert ids("sort_by=updated_at&order=asc") == [c, a, b]
    assert ids("sort_by=updated_at&order=asc&after=" + c) == [a, b]
    assert ids("sort_by=updated_at&order=asc&before=" + b) == [c, a]


def test_list_pagination(client_for, create_session) -> None:
    ids = [create_session(ALICE) for _ in range(5)]
    for minute, session_id in enumerate(ids):
        _stamp(session_id, created=minute, updated=minute)
    client = client_for(ALICE)

    page = client.get("/v1/sessions?limit=2&order=asc").json()
    assert [row["id"] for row in page["data"]] == ids[:2]
    assert page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == (ids[0], ids[1])
    page = client.get(f"/v1/sessions?limit=2&order=asc&after={page['last_id']}").json()
    assert [row["id"] for row in page["data"]] == ids[2:4]
    assert page["has_more"] is True
    page = client.get(f"/v1/sessions?limit=2&order=asc&after={page['last_id']}").json()
    assert [row["id"] for row in page["data"]] == ids[4:]
    assert page["has_more"] is False

    page = client.get(f"/v1/sessions?limit=2&order=asc&before={ids[4]}").json()
    assert [row["id"] for row in page["data"]] == ids[2:4]
    assert page["has_more"] is True
    # In descending order the page just before ids[1] is ids[3], ids[2] (ids[4] remains).
    page = client.get(f"/v1/sessions?limit=2&order=desc&before={ids[1]}").json()
    assert [row["id"] for row in page["data"]] == [ids[3], ids[2]]
    assert page["has_more"] is True
    page = client.get(f"/v1/sessions?limit=10&order=desc&after={ids[2]}").json()
    assert [row["id"] for row in page["data"]] == [ids[1], ids[0]]
    assert page["has_more"] is False

    # The default limit is 20.
    assert len(client.get("/v1/sessions").json()["data"]) == 5


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=-1", "limit=abc", "order=sideways", "sort_by=title"],
)
def test_bad_list_params_are_400(client_for, query) -> None:
    assert_error(client_for(ALICE).get(f"/v1/sessions?{query}"), 400, "invalid_input")


def test_unknown_cursor_and_both_cursors_are_400(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    client = client_for(ALICE)
    assert_error(
        client.get("/v1/sessions?after=conv_nope"), 400, "invalid_input", mentions="cursor"
    )
    response = client.get(f"/v1/sessions?after={session_id}&before={session_id}")
    assert_error(response, 400, "invalid_input")


def test_limit_1000_is_accepted(client_for) -> None:
    assert client_for(ALICE).get("/v1/sessions?limit=1000").status_code == 200


# --- update ----------------------------------------------------------------------------


def test_patch_title_and_labels(client_for, create_session) -> None:
    session_id = create_session(ALICE, title="old", labels={"a": "1"})
    Session.objects.filter(pk=session_id).update(updated_at=BASE_TIME)
    client = client_for(ALICE)
    response = client.patch(
        f"/v1/sessions/{session_id}", {"title": "new", "labels": {"b": "2"}}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == SNAPSHOT_KEYS
    assert body["title"] == "new"
    assert body["labels"] == {"b": "2"}
    assert body["updated_at"] > int(BASE_TIME.timestamp())
    session = Session.objects.get(pk=session_id)
    assert (session.title, session.labels) == ("new", {"b": "2"})

    # Only the given fields change; null clears the title.
    body = client.patch(f"/v1/sessions/{session_id}", {"title": None}, format="json").json()
    assert body["title"] is None and body["labels"] == {"b": "2"}


def test_patch_unknown_key_is_400(client_for, create_session) -> None:
    session_id = create_session(ALICE, title="keep")
    response = client_for(ALICE).patch(
        f"/v1/sessions/{session_id}", {"title": "x", "status": "idle"}, format="json"
    )
    error = assert_error(response, 400, "invalid_input", mentions="status")
    assert error["fields"] == {"status": ["unknown field"]}
    assert Session.objects.get(pk=session_id).title == "keep"


def test_patch_unknown_runner_is_400(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    response = client_for(ALICE).patch(
        f"/v1/sessions/{session_id}", {"runner_id": "runner_token_nope"}, format="json"
    )
    assert_error(response, 400, "invalid_input", mentions="is not registered")
    assert Session.objects.get(pk=session_id).runner_id is None


# --- delete ----------------------------------------------------------------------------


def test_delete_session(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    session = Session.objects.get(pk=session_id)
    agent_id, sha = session.agent_id, session.agent.bundle_sha256
    turn = Turn.objects.create(session=session, status="completed")
    Item.objects.create(session=session, id="item_1", type="message", data={}, response_id=turn.id)
    SessionEvent.objects.create(session=session, seq=1, type="session.status", payload={})
    client = client_for(ALICE)

    response = client.delete(f"/v1/sessions/{session_id}")
    assert response.status_code == 200
    assert response.json() == {"id": session_id, "object": "conversation.deleted", "deleted": True}

    for path in ("", "/items", "/responses", f"/responses/{turn.id}", "/permissions", "/agent"):
        assert_error(client.get(f"/v1/sessions/{session_id}{path}"), 404, "not_found")
    assert_error(client.delete(f"/v1/sessions/{session_id}"), 404, "not_found")
    assert not Session.objects.filter(pk=session_id).exists()
    assert not Agent.objects.filter(pk=agent_id).exists()
    assert Item.objects.count() == 0
    assert Turn.objects.count() == 0
    assert Permission.objects.count() == 0
    assert SessionEvent.objects.count() == 0
    assert not blobs.bundle_path(sha).exists()
    assert client.get("/v1/sessions").json()["data"] == []


def test_delete_session_keeps_its_template(client_for, template) -> None:
    client = client_for(ALICE)
    session_id = client.post("/v1/sessions", {"agent_id": template}, format="json").json()["id"]
    assert client.delete(f"/v1/sessions/{session_id}").status_code == 200
    assert Agent.objects.filter(pk=template, deleted_at__isnull=True).exists()
    assert client.get(f"/v1/agents/{template}").status_code == 200


# --- items, agent, responses -----------------------------------------------------------


def _session_with_items(client, template: str, count: int) -> tuple[str, list[str]]:
    items = [
        {"id": f"item_{n:04d}", "type": "message", "role": "user", "content": f"m{n}"}
        for n in range(count)
    ]
    body = client.post(
        "/v1/sessions", {"agent_id": template, "initial_items": items}, format="json"
    ).json()
    return body["id"], [item["id"] for item in items]


def test_items_flat_shape(client_for, template) -> None:
    client = client_for(ALICE)
    session_id, ids = _session_with_items(client, template, 2)
    body = client.get(f"/v1/sessions/{session_id}/items").json()
    assert body["object"] == "list"
    assert [item["id"] for item in body["data"]] == ids
    first = body["data"][0]
    assert first["type"] == "message"
    assert first["role"] == "user"
    assert first["content"] == [{"type": "input_text", "text": "m0"}]
    assert "data" not in first
    assert first["status"] == "completed"
    assert first["response_id"] is None
    assert first["created_by"] == ALICE
    assert is_int(first["created_at"])
    assert (body["first_id"], body["last_id"], body["has_more"]) == (ids[0], ids[1], False)


def test_items_order_default_limit_and_cursors(client_for, template) -> None:
    client = client_for(ALICE)
    session_id, ids = _session_with_items(client, template, 105)
    url = f"/v1/sessions/{session_id}/items"

    page = client.get(url).json()
    assert [item["id"] for item in page["data"]] == ids[:100]
    assert page["has_more"] is True
    rest = client.get(f"{url}?after={page['last_id']}").json()
    assert [item["id"] for item in rest["data"]] == ids[100:]
    assert rest["has_more"] is False

    desc = client.get(f"{url}?order=desc&limit=3").json()
    assert [item["id"] for item in desc["data"]] == ids[::-1][:3]
    assert desc["has_more"] is True
    back = client.get(f"{url}?limit=2&before={ids[10]}").json()
    assert [item["id"] for item in back["data"]] == ids[8:10]
    assert back["has_more"] is True
    assert_error(client.get(f"{url}?after=item_unknown"), 400, "invalid_input")


def test_session_agent_route(client_for, create_session) -> None:
    session_id = create_session(ALICE, name="my-agent")
    session = Session.objects.get(pk=session_id)
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}/agent").json()
    assert body["id"] == session.agent_id
    assert body["object"] == "agent"
    assert body["name"] == "my-agent"
    assert body["description"] == "Edits files."
    assert body["created_at"] == int(session.agent.created_at.timestamp())


def test_responses_list_and_get(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    session = Session.objects.get(pk=session_id)
    done = Turn.objects.create(session=session, status="completed")
    failed = Turn.objects.create(
        session=session, status="failed", error={"code": "timeout", "message": "too slow"}
    )
    Turn.objects.filter(pk=done.pk).update(
        created_at=BASE_TIME, completed_at=BASE_TIME + timedelta(seconds=5)
    )
    Turn.objects.filter(pk=failed.pk).update(created_at=BASE_TIME + timedelta(minutes=1))
    Item.objects.create(
        session=session,
        id="item_out",
        type="message",
        response_id=done.id,
        data={"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    )
    client = client_for(ALICE)

    listed = client.get(f"/v1/sessions/{session_id}/responses").json()
    assert listed["object"] == "list"
    assert [row["id"] for row in listed["data"]] == [done.id, failed.id]
    assert listed["has_more"] is False
    desc = client.get(f"/v1/sessions/{session_id}/responses?order=desc&limit=1").json()
    assert [row["id"] for row in desc["data"]] == [failed.id]
    assert desc["has_more"] is True

    body = client.get(f"/v1/sessions/{session_id}/responses/{done.id}").json()
    assert body == {
        "id": done.id,
        "object": "response",
        "status": "completed",
        "error": None,
        "output": [
            {
                "id": "item_out",
                "type": "message",
                "status": "completed",
                "response_id": done.id,
                "created_at": body["output"][0]["created_at"],
                "created_by": None,
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            }
        ],
        "created_at": int(BASE_TIME.timestamp()),
        "usage": None,
        "completed_at": int(BASE_TIME.timestamp()) + 5,
    }
    assert is_int(body["output"][0]["created_at"])
    failed_body = client.get(f"/v1/sessions/{session_id}/responses/{failed.id}").json()
    assert failed_body["status"] == "failed"
    assert failed_body["error"] == {"code": "timeout", "message": "too slow"}
    assert failed_body["output"] == []
    assert failed_body["completed_at"] is None

    assert_error(client.get(f"/v1/sessions/{session_id}/responses/resp_unknown"), 404, "not_found")


def test_response_of_another_session_is_404(client_for, create_session) -> None:
    first = create_session(ALICE)
    second = create_session(ALICE)
    turn = Turn.objects.create(session_id=second)
    response = client_for(ALICE).get(f"/v1/sessions/{first}/responses/{turn.id}")
    assert_error(response, 404, "not_found")
