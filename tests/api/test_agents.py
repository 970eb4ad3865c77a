"""Template agents: upload, list, get, delete (http-api.md, Agents)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from sessions import blobs
from sessions.models import Agent, Session

from .conftest import ALICE, BOB, assert_error, stored_files, upload

pytestmark = pytest.mark.django_db

BASE_TIME = datetime(2025, 1, 1, tzinfo=UTC)


def post_agent(client, data: bytes):
    return client.post("/v1/agents", {"bundle": upload(data)}, format="multipart")


def test_upload_creates_a_template_agent(client_for, make_bundle) -> None:
    data = make_bundle("file-helper")
    response = post_agent(client_for(ALICE), data)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"].startswith("ag_")
    assert body["object"] == "agent"
    assert body["name"] == "file-helper"
    assert body["description"] == "Edits files."
    assert isinstance(body["created_at"], int) and not isinstance(body["created_at"], bool)
    assert abs(body["created_at"] - int(datetime.now(UTC).timestamp())) < 60

    agent = Agent.objects.get(pk=body["id"])
    assert agent.kind == Agent.Kind.TEMPLATE
    assert agent.created_by.username == ALICE
    assert agent.model == "mock-model"
    assert agent.bundle_size == len(data)
    # The exact uploaded bytes are kept, addressed by their SHA-256.
    assert blobs.read_bundle(agent.bundle_sha256) == data
    assert stored_files() == [blobs.bundle_path(agent.bundle_sha256)]


def test_duplicate_template_name_is_409(client_for, make_bundle) -> None:
    assert post_agent(client_for(ALICE), make_bundle("dup")).status_code == 201
    # Another user, other bytes, same name.
    other = make_bundle("dup", extra="  max_iterations: 3\n")
    error = assert_error(post_agent(client_for(BOB), other), 409, "conflict", mentions="dup")
    assert "already exists" in error["message"]
    assert Agent.objects.filter(name="dup").count() == 1
    assert len(stored_files()) == 1


def test_session_agents_do_not_take_a_template_name(client_for, create_session, make_bundle):
    create_session(ALICE, name="shared-name")
    assert post_agent(client_for(BOB), make_bundle("shared-name")).status_code == 201


def test_invalid_bundle_is_400_and_stores_nothing(client_for) -> None:
    response = post_agent(client_for(ALICE), b"this is not a tar archive")
    error = assert_error(response, 400, "invalid_input", mentions="not a readable tar")
    assert error["message"].startswith("bundle: ")
    assert error["fields"] == {"bundle": [error["message"].removeprefix("bundle: ")]}
    assert Agent.objects.count() == 0
    assert stored_files() == []


def test_missing_bundle_part_is_400(client_for) -> None:
    response = client_for(ALICE).post("/v1/agents", {"other": "x"}, format="multipart")
    assert_error(response, 400, "invalid_input", mentions="bundle")
    assert Agent.objects.count() == 0


def test_json_body_is_415(client_for) -> None:
    response = client_for(ALICE).post("/v1/agents", {"bundle": "x"}, format="json")
    assert_error(response, 415, "unsupported_media_type")
    assert Agent.objects.count() == 0


def test_oversized_agent_bundle_is_413(client_for, make_bundle, settings) -> None:
    settings.OMNIGENT_MAX_BUNDLE_BYTES = 64
    assert_error(post_agent(client_for(ALICE), make_bundle()), 413, "payload_too_large")
    assert Agent.objects.count() == 0
    assert stored_files() == []


def _three_agents(client, make_bundle) -> list[str]:
    """Agents a, b, c with created_at one minute apart, oldest first."""
    ids = []
    for offset, name in enumerate(["agent-a", "agent-b", "agent-c"]):
        agent_id = post_agent(client, make_bundle(name)).json()["id"]
        Agent.objects.filter(pk=agent_id).update(created_at=BASE_TIME + timedelta(minutes=offset))
        ids.append(agent_id)
    return ids


def test_list_filter_and_pagination(client_for, make_bundle) -> None:
    client = client_for(ALICE)
    a, b, c = _three_agents(client, make_bundle)

    body = client.get("/v1/agents").json()
    assert body["object"] == "list"
    # Default order is newest first.
    assert [row["id"] for row in body["data"]] == [c, b, a]
    assert body["first_id"] == c and body["last_id"] == a and body["has_more"] is False
    assert body["data"][0] == {
        "id": c,
        "object": "agent",
        "name": "agent-c",
        "description": "Edits files.",
        "created_at": int((BASE_TIME + timedelta(minutes=2)).timestamp()),
        "model": "mock-model",
        "version": 1,
    }

    filtered = client.get("/v1/agents?name=agent-b").json()
    assert [row["id"] for row in filtered["data"]] == [b]
    assert client.get("/v1/agents?name=nope").json()["data"] == []

    page1 = client.get("/v1/agents?limit=2&order=asc").json()
    assert [row["id"] for row in page1["data"]] == [a, b]
    assert page1["has_more"] is True
    assert page1["first_id"] == a and page1["last_id"] == b
    page2 = client.get(f"/v1/agents?limit=2&order=asc&after={page1['last_id']}").json()
    assert [row["id"] for row in page2["data"]] == [c]
    assert page2["has_more"] is False
    back = client.get(f"/v1/agents?limit=2&order=asc&before={c}").json()
    assert [row["id"] for row in back["data"]] == [a, b]


def test_list_hides_session_agents_and_deleted_templates(client_for, make_bundle, create_session):
    client = client_for(ALICE)
    create_session(ALICE, name="private-copy")
    kept = post_agent(client, make_bundle("kept")).json()["id"]
    gone = post_agent(client, make_bundle("gone")).json()["id"]
    assert client.delete(f"/v1/agents/{gone}").status_code == 200
    assert [row["id"] for row in client.get("/v1/agents").json()["data"]] == [kept]


def test_get_agent(client_for, make_bundle) -> None:
    created = post_agent(client_for(ALICE), make_bundle("getme")).json()
    # Templates are shared: another user reads it too.
    response = client_for(BOB).get(f"/v1/agents/{created['id']}")
    assert response.status_code == 200
    assert response.json() == {**created}
    assert_error(client_for(ALICE).get("/v1/agents/ag_missing"), 404, "not_found")


def test_session_agent_is_visible_only_to_session_readers(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    agent_id = Session.objects.get(pk=session_id).agent_id
    assert client_for(ALICE).get(f"/v1/agents/{agent_id}").status_code == 200
    assert_error(client_for(BOB).get(f"/v1/agents/{agent_id}"), 404, "not_found")
    # A session agent is not a template: deleting it through /v1/agents is a 404.
    assert_error(client_for(ALICE).delete(f"/v1/agents/{agent_id}"), 404, "not_found")
    assert Agent.objects.filter(pk=agent_id).exists()


def test_delete_agent(client_for, make_bundle) -> None:
    client = client_for(ALICE)
    agent = post_agent(client, make_bundle("short-lived")).json()
    sha = Agent.objects.get(pk=agent["id"]).bundle_sha256
    response = client.delete(f"/v1/agents/{agent['id']}")
    assert response.status_code == 200
    assert response.json() == {"id": agent["id"], "object": "agent.deleted", "deleted": True}
    assert not Agent.objects.filter(pk=agent["id"]).exists()
    assert not blobs.bundle_path(sha).exists()
    assert_error(client.get(f"/v1/agents/{agent['id']}"), 404, "not_found")
    assert_error(client.delete(f"/v1/agents/{agent['id']}"), 404, "not_found")


def test_non_creator_delete_is_403(client_for, make_bundle) -> None:
    agent_id = post_agent(client_for(ALICE), make_bundle("mine")).json()["id"]
    assert_error(client_for(BOB).delete(f"/v1/agents/{agent_id}"), 403, "forbidden")
    assert Agent.objects.get(pk=agent_id).deleted_at is None


def test_admin_can_delete_anyones_template(client_for, make_bundle, django_user_model) -> None:
    django_user_model.objects.create_user(username="root@example.com", is_staff=True)
    agent_id = post_agent(client_for(ALICE), make_bundle("mine")).json()["id"]
    assert client_for("root@example.com").delete(f"/v1/agents/{agent_id}").status_code == 200
    assert not Agent.objects.filter(pk=agent_id).exists()


def test_deleting_a_template_in_use_keeps_the_session(client_for, make_bundle) -> None:
    client = client_for(ALICE)
    data = make_bundle("in-use")
    agent_id = post_agent(client, data).json()["id"]
    created = client.post(
        "/v1/sessions", {"agent_id": agent_id, "title": "uses template"}, format="json"
    )
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]

    assert client.delete(f"/v1/agents/{agent_id}").json() == {
        "id": agent_id,
        "object": "agent.deleted",
        "deleted": True,
    }
    # Hidden from the agent routes, kept for the session.
    assert_error(client.get(f"/v1/agents/{agent_id}"), 404, "not_found")
    assert client.get("/v1/agents").json()["data"] == []
    agent = Agent.objects.get(pk=agent_id)
    assert agent.deleted_at is not None
    assert blobs.read_bundle(agent.bundle_sha256) == data

    session = client.get(f"/v1/sessions/{session_id}")
    assert session.status_code == 200
    assert session.json()["agent_id"] == agent_id
    assert session.json()["agent_name"] == "in-use"
    session_agent = client.get(f"/v1/sessions/{session_id}/agent")
    assert session_agent.status_code == 200
    assert session_agent.json()["id"] == agent_id
    assert session_agent.json()["name"] == "in-use"

    # The name is free again.
    again = post_agent(client, make_bundle("in-use", extra="  timeout: 30\n"))
    assert again.status_code == 201, again.content
    assert again.json()["id"] != agent_id
    assert Agent.objects.filter(name="in-use", deleted_at__isnull=True).count() == 1

    # Deleting the last session that used the hidden template removes it for good.
    assert client.delete(f"/v1/sessions/{session_id}").status_code == 200
    assert not Agent.objects.filter(pk=agent_id).exists()


def test_agent_body_never_leaks_the_api_key(client_for, make_bundle) -> None:
    secret = "sk-secret-value-123456"
    extra = f"  auth:\n    type: api_key\n    api_key: {secret}\n"
    response = post_agent(client_for(ALICE), make_bundle("keyed", extra=extra))
    assert response.status_code == 201
    assert secret not in response.content.decode()
    agent = Agent.objects.get(pk=response.json()["id"])
    assert secret not in json.dumps(agent.spec)
