"""Migrations keep data: the turn model's rename (``Response`` → ``Turn``) moves its rows
and the items that point at them, and turn ids becoming unique per session keeps every
turn, item and approval, on SQLite and on PostgreSQL (``make test-postgres``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("agent_sessions", "0001_initial")]
AFTER = [("agent_sessions", "0002_rename_response_turn")]


@pytest.mark.django_db(transaction=True)
def test_renaming_the_turn_model_keeps_turns_and_their_items() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    agent = old.get_model("agent_sessions", "Agent").objects.create(
        kind="session", name="a", bundle_sha256="0" * 64, bundle_size=1
    )
    session = old.get_model("agent_sessions", "Session").objects.create(agent=agent)
    turn = old.get_model("agent_sessions", "Response").objects.create(
        session=session, status="completed", tools=[{"name": "t"}]
    )
    old.get_model("agent_sessions", "Item").objects.create(
        session=session, id="item_1", type="message", response=turn
    )

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    moved = new.get_model("agent_sessions", "Turn").objects.get(pk=turn.pk)
    assert (moved.status, moved.tools, moved.session_id) == (
        "completed",
        [{"name": "t"}],
        session.pk,
    )
    assert list(moved.items.values_list("id", flat=True)) == ["item_1"]
    assert new.get_model("agent_sessions", "Session").objects.get(pk=session.pk).turns.count() == 1


PER_SESSION_BEFORE = [("agent_sessions", "0005_workspace_sharing")]
PER_SESSION_AFTER = [("agent_sessions", "0006_turn_ids_per_session")]


@pytest.mark.django_db(transaction=True)
def test_turn_ids_per_session_keep_turns_items_and_approvals() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(PER_SESSION_BEFORE)
    old = executor.loader.project_state(PER_SESSION_BEFORE).apps
    agent = old.get_model("agent_sessions", "Agent").objects.create(
        kind="session", name="a", bundle_sha256="0" * 64, bundle_size=1
    )
    session = old.get_model("agent_sessions", "Session").objects.create(agent=agent)
    old_turn = old.get_model("agent_sessions", "Turn")
    first = old_turn.objects.create(session=session, id="resp_a", status="completed")
    second = old_turn.objects.create(session=session, id="resp_b", status="in_progress")
    old.get_model("agent_sessions", "Item").objects.create(
        session=session, id="item_1", type="message", response=first
    )
    old.get_model("agent_sessions", "Approval").objects.create(
        id="elicit_1",
        session=session,
        turn=second,
        call_id="call_1",
        tool="t",
        policy_name="p",
        message="m",
        expires_at=timezone.now(),
    )

    executor = MigrationExecutor(connection)
    executor.migrate(PER_SESSION_AFTER)
    new = executor.loader.project_state(PER_SESSION_AFTER).apps
    turn = new.get_model("agent_sessions", "Turn")
    moved = list(turn.objects.order_by("seq").values_list("seq", "id", "status", "session_id"))
    assert moved == [
        (1, "resp_a", "completed", session.pk),
        (2, "resp_b", "in_progress", session.pk),
    ]
    item = new.get_model("agent_sessions", "Item").objects.get(id="item_1")
    assert (item.session_id, item.response_id) == (session.pk, "resp_a")
    approval = new.get_model("agent_sessions", "Approval").objects.get(pk="elicit_1")
    assert (approval.session_id, approval.response_id) == (session.pk, "resp_b")
    # The same id in another session (a fork's copy); twice in one session is refused.
    other = new.get_model("agent_sessions", "Session").objects.create(agent_id=agent.pk)
    copy = turn.objects.create(session_id=other.pk, id="resp_a", status="completed")
    assert copy.seq == 3  # numbering goes on after the migrated rows
    with pytest.raises(IntegrityError), transaction.atomic():
        turn.objects.create(session_id=other.pk, id="resp_a")


SEARCH_BEFORE = [("agent_sessions", "0007_list_events")]
SEARCH_AFTER = [("agent_sessions", "0008_full_text_search")]


@pytest.mark.django_db(transaction=True)
def test_the_search_index_takes_in_existing_items_and_titles() -> None:
    from sessions import search

    executor = MigrationExecutor(connection)
    executor.migrate(SEARCH_BEFORE)
    old = executor.loader.project_state(SEARCH_BEFORE).apps
    agent = old.get_model("agent_sessions", "Agent").objects.create(
        kind="session", name="a", bundle_sha256="0" * 64, bundle_size=1
    )
    session = old.get_model("agent_sessions", "Session").objects.create(
        agent=agent, title="Quarterly Report"
    )
    old.get_model("agent_sessions", "Item").objects.create(
        session=session,
        id="item_1",
        type="message",
        data={"role": "user", "content": [{"type": "input_text", "text": "Résumé of the outage"}]},
    )

    executor = MigrationExecutor(connection)
    executor.migrate(SEARCH_AFTER)
    new = executor.loader.project_state(SEARCH_AFTER).apps
    sessions = new.get_model("agent_sessions", "Session").objects.all()
    for text in ("resume outa", "quarter"):
        query = search.parse(text)
        assert query is not None
        assert list(search.filter_sessions(sessions, query).values_list("id", flat=True)) == [
            session.pk
        ]
    query = search.parse("outage")
    assert query is not None
    assert search.first_hits(query, [session.pk])[session.pk].item_id == "item_1"
    # Back down: the index goes; up again: it is rebuilt.
    executor = MigrationExecutor(connection)
    executor.migrate(SEARCH_BEFORE)
    executor = MigrationExecutor(connection)
    executor.migrate(SEARCH_AFTER)
    assert list(search.filter_sessions(sessions, query).values_list("id", flat=True)) == [
        session.pk
    ]


@pytest.fixture(autouse=True)
def _back_to_the_latest_schema() -> Iterator[None]:
    """Later tests expect every migration applied, whatever this one left."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    # As ``migrate`` does after it runs: a rebuilt table lost its search triggers.
    from sessions import search_index

    search_index.ensure_installed(connection.alias)
