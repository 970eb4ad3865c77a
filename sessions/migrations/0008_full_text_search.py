"""The full-text index of item text and session titles (lifecycle.md, Search): FTS5
tables on SQLite, ``tsvector`` + GIN (and a trigram index) on PostgreSQL, written by
triggers in the item's own statement; existing rows are indexed here
(``sessions/search_index.py``)."""

from django.db import migrations


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    from sessions import search_index

    search_index.install(schema_editor.connection, rebuild=True)


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    from sessions import search_index

    search_index.uninstall(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("agent_sessions", "0007_list_events")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.RunPython(forward, backward, elidable=False),
    ]
