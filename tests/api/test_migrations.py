"""Migrations keep data: the turn model's rename (``Response`` → ``Turn``) moves its rows
and the items that point at them, on SQLite and on PostgreSQL (``make test-postgres``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

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


@pytest.fixture(autouse=True)
def _back_to_the_latest_schema() -> Iterator[None]:
    """Later tests expect every migration applied, whatever this one left."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
