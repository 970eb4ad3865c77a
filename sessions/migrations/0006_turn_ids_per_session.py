"""A response id is unique per session, not across sessions (files.md, Fork).

A fork copies its source's turns under their own ids, so the turn table gets a row
key of its own (``seq``) and ``(session, id)`` is unique. Items and approvals name
their turn by ``response_id`` within their session: the columns keep their values
(they held the turn ids already); only the database foreign keys to the old primary
key go.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

import omnigent_site.ids


def _turn_key_fields(
    turn: type[models.Model], *, seq_is_key: bool
) -> tuple[models.Field[Any, Any], models.Field[Any, Any]]:
    """The turn's ``id`` and ``seq`` fields with the key on ``seq`` or on ``id``, built
    here: inside ``SeparateDatabaseAndState`` the historical model is the one from
    before the operation, whichever way it runs."""
    id_field = models.CharField(
        default=omnigent_site.ids.new_response_id, max_length=64, primary_key=not seq_is_key
    )
    seq_field: models.Field[Any, Any] = (
        models.BigAutoField(primary_key=True) if seq_is_key else models.BigIntegerField(null=True)
    )
    for field, name in ((id_field, "id"), (seq_field, "seq")):
        field.set_attributes_from_name(name)
        field.model = turn
    return id_field, seq_field


def _seq_becomes_the_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """``seq`` becomes the primary key and ``id`` a plain column, in the order each
    database needs: PostgreSQL drops the old key before it adds the new one; SQLite
    rebuilds the table once, taking the key off ``id`` as it puts it on ``seq``."""
    turn = apps.get_model("agent_sessions", "Turn")
    old_id, old_seq = _turn_key_fields(turn, seq_is_key=False)
    new_id, new_seq = _turn_key_fields(turn, seq_is_key=True)
    if schema_editor.connection.vendor != "sqlite":
        schema_editor.alter_field(turn, old_id, new_id)
        _drop_plain_indexes(schema_editor, turn._meta.db_table, column="id")
    schema_editor.alter_field(turn, old_seq, new_seq)
    if schema_editor.connection.vendor == "postgresql":
        # New rows are numbered after the migrated ones (the new identity starts at 1).
        table = schema_editor.quote_name(turn._meta.db_table)
        schema_editor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), "
            f'COALESCE(MAX("seq"), 0) + 1, false) FROM {table}'
        )


def _id_becomes_the_key(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Back: ``id`` the primary key again (which fails once two sessions share an id)."""
    turn = apps.get_model("agent_sessions", "Turn")
    old_id, old_seq = _turn_key_fields(turn, seq_is_key=True)
    new_id, new_seq = _turn_key_fields(turn, seq_is_key=False)
    if schema_editor.connection.vendor != "sqlite":
        _drop_primary_key(schema_editor, turn._meta.db_table)
        schema_editor.alter_field(turn, old_seq, new_seq)
    schema_editor.alter_field(turn, old_id, new_id)


def _drop_plain_indexes(
    schema_editor: BaseDatabaseSchemaEditor, table: str, *, column: str
) -> None:
    """Indexes left on ``column`` by its time as the key (PostgreSQL's ``_like`` index,
    named after the table's old name, which Django's own cleanup does not find)."""
    for name, info in _constraints(schema_editor, table).items():
        plain = info["index"] and not info["unique"] and not info["primary_key"]
        if plain and info["columns"] == [column]:
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def _drop_primary_key(schema_editor: BaseDatabaseSchemaEditor, table: str) -> None:
    """The table's primary key constraint, dropped before its column changes."""
    for name, info in _constraints(schema_editor, table).items():
        if info["primary_key"]:
            schema_editor.execute(
                f"ALTER TABLE {schema_editor.quote_name(table)} "
                f"DROP CONSTRAINT {schema_editor.quote_name(name)}"
            )


def _constraints(schema_editor: BaseDatabaseSchemaEditor, table: str) -> dict[str, Any]:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return dict(connection.introspection.get_constraints(cursor, table))


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0005_workspace_sharing"),
    ]

    operations: list[migrations.operations.base.Operation] = [
        # The foreign keys to turn.id go first (the column stays, values unchanged).
        migrations.RemoveConstraint(model_name="approval", name="unique_approval_per_call"),
        migrations.AlterField(
            model_name="item",
            name="response",
            field=models.ForeignKey(
                blank=True,
                null=True,
                db_constraint=False,
                on_delete=models.deletion.SET_NULL,
                related_name="items",
                to="agent_sessions.turn",
            ),
        ),
        migrations.AlterField(
            model_name="approval",
            name="turn",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=models.deletion.CASCADE,
                related_name="approvals",
                to="agent_sessions.turn",
            ),
        ),
        # The same columns, now plain text (an unconstrained foreign key to a varchar key
        # and an indexed varchar are the same column with the same index).
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(model_name="item", name="response"),
                migrations.AddField(
                    model_name="item",
                    name="response_id",
                    field=models.CharField(blank=True, db_index=True, max_length=64, null=True),
                ),
                migrations.RemoveField(model_name="approval", name="turn"),
                migrations.AddField(
                    model_name="approval",
                    name="turn_id",
                    field=models.CharField(db_index=True, max_length=64),
                ),
            ]
        ),
        migrations.RenameField(model_name="approval", old_name="turn_id", new_name="response_id"),
        migrations.AlterField(
            model_name="approval",
            name="response_id",
            field=models.CharField(max_length=64),
        ),
        # The turn's own row key, numbered in the turns' order, then made the primary
        # key (which drops the old one); its id is unique per session.
        migrations.AddField(
            model_name="turn",
            name="seq",
            field=models.BigIntegerField(null=True),
        ),
        migrations.RunSQL(
            'UPDATE "agent_sessions_turn" SET "seq" = numbered.n FROM (SELECT "id", '
            'row_number() OVER (ORDER BY "created_at", "id") AS n FROM "agent_sessions_turn") '
            'AS numbered WHERE "agent_sessions_turn"."id" = numbered."id"',
            migrations.RunSQL.noop,
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="turn",
                    name="seq",
                    field=models.BigAutoField(primary_key=True, serialize=False),
                ),
                migrations.AlterField(
                    model_name="turn",
                    name="id",
                    field=models.CharField(
                        default=omnigent_site.ids.new_response_id, editable=False, max_length=64
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(_seq_becomes_the_key, _id_becomes_the_key, elidable=False)
            ],
        ),
        migrations.AddConstraint(
            model_name="turn",
            constraint=models.UniqueConstraint(
                fields=("session", "id"), name="unique_turn_per_session"
            ),
        ),
        migrations.AddConstraint(
            model_name="approval",
            constraint=models.UniqueConstraint(
                fields=("session", "response_id", "call_id"), name="unique_approval_per_call"
            ),
        ),
    ]
