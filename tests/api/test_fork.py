"""Fork (files.md §3): the copy rules and every status of ``POST …/fork``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from sessions.models import Agent, FileBlob, Item, Permission, Session, SessionFile, Turn

from .conftest import ALICE, BOB, CAROL, assert_error, upload
from .files_helpers import post_file

pytestmark = pytest.mark.django_db

Client = Callable[[str | None], APIClient]


def fork(client: APIClient, session_id: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(f"/v1/sessions/{session_id}/fork", body or {}, format="json")


def add_history(session_id: str) -> dict[str, Turn]:
    """Three turns as the runner leaves them: done, failed, and one still running."""
    session = Session.objects.get(pk=session_id)
    past = timezone.now() - timedelta(days=3)
    turns: dict[str, Turn] = {}
    for index, status in enumerate(["completed", "failed", "in_progress"]):
        turn = Turn.objects.create(session=session, status=status)
        Turn.objects.filter(pk=turn.pk).update(created_at=past + timedelta(hours=index))
        turn.refresh_from_db()
        turns[status] = turn
        Item.objects.create(
            session=session,
            id=f"item_user_{index}",
            response_id=turn.id,
            type="message",
            data={"role": "user", "content": [{"type": "input_text", "text": f"question {index}"}]},
            created_by=ALICE,
        )
        Item.objects.create(
            session=session,
            id=f"item_answer_{index}",
            response_id=turn.id,
            type="message",
            data={
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"answer {index}"}],
            },
        )
    Item.objects.filter(session=session).update(created_at=past)
    return turns


def texts(items: list[dict[str, Any]]) -> list[str]:
    return [item["data"]["content"][0]["text"] for item in items]


def test_fork_copies_history_turns_labels_and_makes_the_caller_owner(
    client_for: Client, create_session: Callable[..., str], grant: Any
) -> None:
    source = create_session(title="Plan", labels={"team": "blue"})
    turns = add_history(source)
    grant(source, BOB, 1)
    grant(source, CAROL, 3)
    response = fork(client_for(BOB), source)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != source and body["object"] == "session"
    assert body["title"] == "Fork of Plan"
    assert body["labels"] == {"team": "blue", "omnigent.fork.source_id": source}
    assert body["runner_id"] is None and body["status"] == "idle"
    assert body["permission_level"] == 4
    grants = Permission.objects.filter(session_id=body["id"])
    assert [(g.user.username, g.level) for g in grants] == [(BOB, 4)]
    # The running turn and its items are not copied.
    assert texts(body["items"]) == ["question 0", "answer 0", "question 1", "answer 1"]
    originals = {i.data["content"][0]["text"]: i for i in Item.objects.filter(session_id=source)}
    for copied in body["items"]:
        original = originals[copied["data"]["content"][0]["text"]]
        assert copied["id"] != original.id
        assert copied["created_at"] == int(original.created_at.timestamp())
        assert copied["created_by"] == original.created_by
    copied_turns = list(Turn.objects.filter(session_id=body["id"]).order_by("created_at"))
    assert [t.status for t in copied_turns] == ["completed", "failed"]
    # The copies keep the source's response ids, and the items keep naming them.
    assert [t.id for t in copied_turns] == [turns["completed"].id, turns["failed"].id]
    assert copied_turns[0].created_at == turns["completed"].created_at
    assert [item["response_id"] for item in body["items"]] == [
        turns["completed"].id,
        turns["completed"].id,
        turns["failed"].id,
        turns["failed"].id,
    ]
    responses = client_for(BOB).get(f"/v1/sessions/{body['id']}/responses").json()["data"]
    assert [r["id"] for r in responses] == [turns["completed"].id, turns["failed"].id]
    assert [r["status"] for r in responses] == ["completed", "failed"]
    assert [o["content"][0]["text"] for o in responses[0]["output"]] == ["answer 0"]
    # The source is unchanged.
    assert Item.objects.filter(session_id=source).count() == 6


def test_up_to_response_id_stops_after_that_turn(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    source = create_session()
    turns = add_history(source)
    alice = client_for(ALICE)
    body = fork(
        alice, source, {"up_to_response_id": turns["completed"].id, "title": "early"}
    ).json()
    assert body["title"] == "early"
    assert texts(body["items"]) == ["question 0", "answer 0"]
    assert Turn.objects.filter(session_id=body["id"]).count() == 1
    for bad in ("resp_unknown", turns["in_progress"].id):
        assert_error(fork(alice, source, {"up_to_response_id": bad}), 400, "invalid_input")
    other = create_session()
    other_turns = add_history(other)
    assert_error(
        fork(alice, source, {"up_to_response_id": other_turns["completed"].id}),
        400,
        "invalid_input",
    )
    assert_error(fork(alice, source, {"up_to_response_id": 5}), 400, "invalid_input")


def test_title_defaults_to_the_id_without_a_title(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    source = create_session()
    assert fork(client_for(ALICE), source).json()["title"] == f"Fork of {source}"


def test_files_are_copied_by_reference_and_blocks_follow(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    source = create_session()
    alice = client_for(ALICE)
    uploaded = post_file(alice, source, "spec.txt", b"the spec").json()
    turn = Turn.objects.create(session_id=source, status="completed")
    Item.objects.create(
        session_id=source,
        id="item_with_file",
        response_id=turn.id,
        type="message",
        data={
            "role": "user",
            "content": [{"type": "input_file", "file_id": uploaded["id"], "filename": "spec.txt"}],
        },
    )
    body = fork(alice, source).json()
    copies = list(SessionFile.objects.filter(session_id=body["id"]))
    assert len(copies) == 1 and copies[0].pk != uploaded["id"]
    assert copies[0].sha256 == uploaded["metadata"]["sha256"] and copies[0].name == "spec.txt"
    assert FileBlob.objects.count() == 1
    assert body["items"][0]["data"]["content"][0]["file_id"] == copies[0].pk
    # Deleting the source keeps the bytes the fork still uses.
    assert alice.delete(f"/v1/sessions/{source}").status_code == 200
    content = alice.get(f"/v1/sessions/{body['id']}/resources/files/{copies[0].pk}/content")
    assert b"".join(content.streaming_content) == b"the spec"


def test_the_agent_is_shared_when_usable_else_copied(
    client_for: Client, create_session: Callable[..., str], make_bundle: Any, grant: Any
) -> None:
    alice = client_for(ALICE)
    private = create_session()
    grant(private, BOB, 1)
    body = fork(client_for(BOB), private).json()
    source_agent = Session.objects.get(pk=private).agent
    fork_agent = Agent.objects.get(pk=body["agent_id"])
    assert fork_agent.pk != source_agent.pk and fork_agent.kind == "session"
    assert fork_agent.bundle_sha256 == source_agent.bundle_sha256
    assert fork_agent.name == source_agent.name
    template = alice.post(
        "/v1/agents",
        {"bundle": upload(make_bundle("tpl"))},
        format="multipart",
    ).json()["id"]
    from_template = alice.post("/v1/sessions", {"agent_id": template}, format="json").json()["id"]
    assert fork(alice, from_template).json()["agent_id"] == template


def test_fork_statuses(client_for: Client, create_session: Callable[..., str]) -> None:
    source = create_session()
    assert_error(fork(client_for(CAROL), source), 404, "not_found")
    assert_error(fork(client_for(None), source), 401, "unauthorized")
    assert_error(fork(client_for(ALICE), "conv_missing"), 404, "not_found")
    response = client_for(ALICE).post(
        f"/v1/sessions/{source}/fork", "title=x", content_type="text/plain"
    )
    assert_error(response, 415, "unsupported_media_type")
    assert_error(fork(client_for(ALICE), source, {"title": 5}), 400, "invalid_input")
    # Unknown keys are ignored.
    assert fork(client_for(ALICE), source, {"surprise": 1}).status_code == 201


def test_the_source_response_ids_answer_on_the_fork_and_on_a_fork_of_it(
    client_for: Client, create_session: Callable[..., str]
) -> None:
    """A client that read response ids from the source uses them on the fork: one turn,
    the listing's cursor, ``up_to_response_id``, and all of that again on a fork of
    the fork, while each session keeps its own copy of the turn."""
    source = create_session()
    turns = add_history(source)
    done, failed = turns["completed"].id, turns["failed"].id
    alice = client_for(ALICE)
    first = fork(alice, source).json()["id"]
    one = alice.get(f"/v1/sessions/{first}/responses/{done}")
    assert one.status_code == 200, one.content
    assert one.json()["id"] == done and one.json()["status"] == "completed"
    assert [o["content"][0]["text"] for o in one.json()["output"]] == ["answer 0"]
    page = alice.get(f"/v1/sessions/{first}/responses", {"after": done}).json()["data"]
    assert [r["id"] for r in page] == [failed]
    missing = alice.get(f"/v1/sessions/{first}/responses/{turns['in_progress'].id}")
    assert_error(missing, 404, "not_found")

    second = fork(alice, first, {"up_to_response_id": done})
    assert second.status_code == 201, second.content
    body = second.json()
    assert texts(body["items"]) == ["question 0", "answer 0"]
    assert {item["response_id"] for item in body["items"]} == {done}
    again = alice.get(f"/v1/sessions/{body['id']}/responses/{done}").json()
    assert again["id"] == done and [o["content"][0]["text"] for o in again["output"]] == [
        "answer 0"
    ]
    # Three sessions, three rows with the same response id; each is its session's own.
    assert Turn.objects.filter(id=done).count() == 3
    Turn.objects.filter(session_id=first, id=done).update(status="cancelled")
    assert alice.get(f"/v1/sessions/{source}/responses/{done}").json()["status"] == "completed"
    assert alice.get(f"/v1/sessions/{first}/responses/{done}").json()["status"] == "cancelled"
