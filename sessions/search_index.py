"""The full-text index behind ``GET /v1/sessions?search_query=`` (lifecycle.md, Search).

The index is the database's own and is kept by the database: triggers on the item and
session tables write it in the statement (and so the transaction) that writes the row,
whichever code path wrote it (a runner's item, a message, ``initial_items``, a fork's
copies, an import, the admin) and delete it with the row.

- SQLite: two FTS5 tables, ``unicode61`` with diacritics removed. Items are keyed by
  ``Item.seq`` (the rowid), titles by the session row's rowid.
- PostgreSQL: two tables with a ``tsvector`` (``simple`` configuration, so no stemming:
  words and prefixes) under a GIN index, and a trigram GIN index on the text for the
  literal part of a word with punctuation in it (``pg_trgm``); ``unaccent`` folds
  accents. Either extension is optional: without it the search works without that part
  (accents count, the literal part scans).

An item's indexed text is every string under the keys in ``TEXT_KEYS`` anywhere in its
``data`` (message text, a call's tool name and arguments, its output), the first
``MAX_TEXT`` characters of it. ``install`` is idempotent; SQLite drops a table's triggers
when a migration rebuilds the table, so ``ensure_installed`` (after every ``migrate``)
puts them back and rebuilds the index if any was missing.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

ITEM_TABLE = "agent_sessions_item"
SESSION_TABLE = "agent_sessions_session"
# SQLite
ITEM_FTS = "agent_sessions_item_fts"
TITLE_FTS = "agent_sessions_title_fts"
# PostgreSQL
ITEM_SEARCH = "agent_sessions_item_search"
TITLE_SEARCH = "agent_sessions_title_search"

TEXT_KEYS = ("text", "content", "name", "arguments", "output", "refusal")
MAX_TEXT = 100_000

SQLITE_TOKENIZER = "unicode61 remove_diacritics 2"
SQLITE_TRIGGERS = (
    "agent_sessions_item_fts_insert",
    "agent_sessions_item_fts_update",
    "agent_sessions_item_fts_delete",
    "agent_sessions_title_fts_insert",
    "agent_sessions_title_fts_update",
    "agent_sessions_title_fts_delete",
)


def _keys_sql() -> str:
    return ", ".join(f"'{key}'" for key in TEXT_KEYS)


def _sqlite_item_text(row: str) -> str:
    return (
        f"substr(coalesce((SELECT group_concat(value, ' ') FROM json_tree({row}.data) "
        f"WHERE type = 'text' AND key IN ({_keys_sql()})), ''), 1, {MAX_TEXT})"
    )


def _sqlite_statements() -> list[str]:
    item_values = (
        f"(rowid, session_id, body) VALUES (new.seq, new.session_id, {_sqlite_item_text('new')})"
    )
    return [
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {ITEM_FTS} USING fts5("
        f"session_id UNINDEXED, body, tokenize = '{SQLITE_TOKENIZER}')",
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {TITLE_FTS} USING fts5("
        f"session_id UNINDEXED, body, tokenize = '{SQLITE_TOKENIZER}')",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_item_fts_insert AFTER INSERT ON "
        f"{ITEM_TABLE} BEGIN INSERT INTO {ITEM_FTS} {item_values}; END",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_item_fts_update AFTER UPDATE OF data "
        f"ON {ITEM_TABLE} BEGIN DELETE FROM {ITEM_FTS} WHERE rowid = old.seq; "
        f"INSERT INTO {ITEM_FTS} {item_values}; END",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_item_fts_delete AFTER DELETE ON "
        f"{ITEM_TABLE} BEGIN DELETE FROM {ITEM_FTS} WHERE rowid = old.seq; END",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_title_fts_insert AFTER INSERT ON "
        f"{SESSION_TABLE} WHEN coalesce(new.title, '') != '' BEGIN INSERT INTO {TITLE_FTS} "
        f"(rowid, session_id, body) VALUES (new.rowid, new.id, new.title); END",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_title_fts_update AFTER UPDATE OF title "
        f"ON {SESSION_TABLE} BEGIN DELETE FROM {TITLE_FTS} WHERE rowid = old.rowid; "
        f"INSERT INTO {TITLE_FTS} (rowid, session_id, body) SELECT new.rowid, new.id, "
        f"new.title WHERE coalesce(new.title, '') != ''; END",
        f"CREATE TRIGGER IF NOT EXISTS agent_sessions_title_fts_delete AFTER DELETE ON "
        f"{SESSION_TABLE} BEGIN DELETE FROM {TITLE_FTS} WHERE rowid = old.rowid; END",
    ]


def _sqlite_rebuild() -> list[str]:
    return [
        f"DELETE FROM {ITEM_FTS}",
        f"INSERT INTO {ITEM_FTS} (rowid, session_id, body) SELECT seq, session_id, "
        f"{_sqlite_item_text(ITEM_TABLE)} FROM {ITEM_TABLE}",
        f"DELETE FROM {TITLE_FTS}",
        f"INSERT INTO {TITLE_FTS} (rowid, session_id, body) SELECT rowid, id, title "
        f"FROM {SESSION_TABLE} WHERE coalesce(title, '') != ''",
    ]


def _postgres_has(db: BaseDatabaseWrapper, extension: str) -> bool:
    with db.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = %s", [extension])
        return cursor.fetchone() is not None


def _postgres_try_extension(db: BaseDatabaseWrapper, extension: str) -> bool:
    """Create the extension if this role may (both are trusted extensions since
    PostgreSQL 13: a database owner may); without it the search does without."""
    if _postgres_has(db, extension):
        return True
    try:
        with transaction.atomic(using=db.alias), db.cursor() as cursor:
            cursor.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
    except Exception:  # noqa: BLE001 - no privilege or not installed: go on without
        return False
    return True


def _postgres_statements(*, unaccent: bool, trigram: bool) -> list[str]:
    fold = "lower(unaccent(coalesce(t, '')))" if unaccent else "lower(coalesce(t, ''))"
    keys = _keys_sql()
    statements = [
        # STABLE, not IMMUTABLE: unaccent depends on its dictionary. Used by the triggers
        # and on the query's side only, never in an index expression.
        f"CREATE OR REPLACE FUNCTION omnigent_search_fold(t text) RETURNS text "
        f"LANGUAGE sql STABLE AS $$ SELECT {fold} $$",
        "CREATE OR REPLACE FUNCTION omnigent_search_document(t text) RETURNS tsvector "
        "LANGUAGE sql STABLE AS $$ SELECT to_tsvector('simple', regexp_replace("
        "omnigent_search_fold(t), '[[:punct:][:space:]]+', ' ', 'g')) $$",
        f"""CREATE OR REPLACE FUNCTION omnigent_search_item_text(doc jsonb) RETURNS text
        LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE k text; v jsonb; parts text[] := '{{}}';
        BEGIN
          IF jsonb_typeof(doc) = 'object' THEN
            FOR k, v IN SELECT key, value FROM jsonb_each(doc) LOOP
              IF jsonb_typeof(v) = 'string' THEN
                IF k IN ({keys}) THEN parts := parts || (v #>> '{{}}'); END IF;
              ELSIF jsonb_typeof(v) IN ('object', 'array') THEN
                parts := parts || omnigent_search_item_text(v);
              END IF;
            END LOOP;
          ELSIF jsonb_typeof(doc) = 'array' THEN
            FOR v IN SELECT value FROM jsonb_array_elements(doc) LOOP
              parts := parts || omnigent_search_item_text(v);
            END LOOP;
          END IF;
          RETURN array_to_string(array_remove(parts, ''), ' ');
        END $$""",
        f"CREATE TABLE IF NOT EXISTS {ITEM_SEARCH} (item_seq bigint PRIMARY KEY, "
        "session_id varchar(64) NOT NULL, body text NOT NULL, document tsvector NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {ITEM_SEARCH}_document ON {ITEM_SEARCH} USING gin (document)",
        f"CREATE INDEX IF NOT EXISTS {ITEM_SEARCH}_session ON {ITEM_SEARCH} (session_id)",
        f"CREATE TABLE IF NOT EXISTS {TITLE_SEARCH} (session_id varchar(64) PRIMARY KEY, "
        "body text NOT NULL, document tsvector NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {TITLE_SEARCH}_document ON {TITLE_SEARCH} "
        "USING gin (document)",
        f"""CREATE OR REPLACE FUNCTION omnigent_search_item_write() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE body text;
        BEGIN
          IF TG_OP = 'DELETE' THEN
            DELETE FROM {ITEM_SEARCH} WHERE item_seq = OLD.seq;
            RETURN NULL;
          END IF;
          body := left(omnigent_search_item_text(NEW.data::jsonb), {MAX_TEXT});
          INSERT INTO {ITEM_SEARCH} (item_seq, session_id, body, document)
          VALUES (NEW.seq, NEW.session_id, body, omnigent_search_document(body))
          ON CONFLICT (item_seq) DO UPDATE SET session_id = EXCLUDED.session_id,
            body = EXCLUDED.body, document = EXCLUDED.document;
          RETURN NULL;
        END $$""",
        f"""CREATE OR REPLACE FUNCTION omnigent_search_title_write() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF TG_OP <> 'INSERT' THEN
            DELETE FROM {TITLE_SEARCH} WHERE session_id = OLD.id;
          END IF;
          IF TG_OP <> 'DELETE' AND coalesce(NEW.title, '') <> '' THEN
            INSERT INTO {TITLE_SEARCH} (session_id, body, document)
            VALUES (NEW.id, NEW.title, omnigent_search_document(NEW.title))
            ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body,
              document = EXCLUDED.document;
          END IF;
          RETURN NULL;
        END $$""",
        f"DROP TRIGGER IF EXISTS agent_sessions_item_search_write ON {ITEM_TABLE}",
        "CREATE TRIGGER agent_sessions_item_search_write AFTER INSERT OR UPDATE OF data "
        f"OR DELETE ON {ITEM_TABLE} FOR EACH ROW EXECUTE FUNCTION omnigent_search_item_write()",
        f"DROP TRIGGER IF EXISTS agent_sessions_title_search_write ON {SESSION_TABLE}",
        "CREATE TRIGGER agent_sessions_title_search_write AFTER INSERT OR UPDATE OF title "
        f"OR DELETE ON {SESSION_TABLE} FOR EACH ROW "
        "EXECUTE FUNCTION omnigent_search_title_write()",
    ]
    if trigram:
        statements.append(
            f"CREATE INDEX IF NOT EXISTS {ITEM_SEARCH}_trigram ON {ITEM_SEARCH} "
            "USING gin (body gin_trgm_ops)"
        )
    return statements


def _postgres_rebuild() -> list[str]:
    return [
        f"TRUNCATE {ITEM_SEARCH}",
        f"INSERT INTO {ITEM_SEARCH} (item_seq, session_id, body, document) "
        f"SELECT seq, session_id, body, omnigent_search_document(body) FROM (SELECT seq, "
        f"session_id, left(omnigent_search_item_text(data::jsonb), {MAX_TEXT}) AS body "
        f"FROM {ITEM_TABLE}) t",
        f"TRUNCATE {TITLE_SEARCH}",
        f"INSERT INTO {TITLE_SEARCH} (session_id, body, document) SELECT id, title, "
        f"omnigent_search_document(title) FROM {SESSION_TABLE} WHERE coalesce(title, '') <> ''",
    ]


def _execute(db: BaseDatabaseWrapper, statements: list[str]) -> None:
    with db.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def install(db: BaseDatabaseWrapper, *, rebuild: bool = True) -> None:
    """Create the index tables and triggers (idempotent) and, with ``rebuild``, index
    every existing row."""
    if db.vendor == "sqlite":
        _execute(db, _sqlite_statements())
        if rebuild:
            _execute(db, _sqlite_rebuild())
    elif db.vendor == "postgresql":
        unaccent = _postgres_try_extension(db, "unaccent")
        trigram = _postgres_try_extension(db, "pg_trgm")
        _execute(db, _postgres_statements(unaccent=unaccent, trigram=trigram))
        if rebuild:
            _execute(db, _postgres_rebuild())


def uninstall(db: BaseDatabaseWrapper) -> None:
    if db.vendor == "sqlite":
        _execute(
            db,
            [f"DROP TRIGGER IF EXISTS {name}" for name in SQLITE_TRIGGERS]
            + [f"DROP TABLE IF EXISTS {ITEM_FTS}", f"DROP TABLE IF EXISTS {TITLE_FTS}"],
        )
    elif db.vendor == "postgresql":
        _execute(
            db,
            [
                f"DROP TRIGGER IF EXISTS agent_sessions_item_search_write ON {ITEM_TABLE}",
                f"DROP TRIGGER IF EXISTS agent_sessions_title_search_write ON {SESSION_TABLE}",
                f"DROP TABLE IF EXISTS {ITEM_SEARCH}",
                f"DROP TABLE IF EXISTS {TITLE_SEARCH}",
                "DROP FUNCTION IF EXISTS omnigent_search_item_write()",
                "DROP FUNCTION IF EXISTS omnigent_search_title_write()",
                "DROP FUNCTION IF EXISTS omnigent_search_item_text(jsonb)",
                "DROP FUNCTION IF EXISTS omnigent_search_document(text)",
                "DROP FUNCTION IF EXISTS omnigent_search_fold(text)",
            ],
        )


def _sqlite_missing_triggers(db: BaseDatabaseWrapper) -> bool | None:
    """None: the index is not installed (the database is before its migration)."""
    with db.cursor() as cursor:
        cursor.execute(
            "SELECT type, name FROM sqlite_master WHERE name IN (%s, %s) OR type = 'trigger'",
            [ITEM_FTS, TITLE_FTS],
        )
        found = {name for _kind, name in cursor.fetchall()}
    if ITEM_FTS not in found:
        return None
    return not set(SQLITE_TRIGGERS) <= found


def ensure_installed(using: str = "default", **_: Any) -> None:
    """After ``migrate``: put back triggers a table rebuild dropped (SQLite), and rebuild
    the index then, since the rows were copied without them."""
    from django.db import connections

    db = connections[using]
    if db.vendor != "sqlite":
        return
    missing = _sqlite_missing_triggers(db)
    if missing:
        with transaction.atomic(using=using):
            install(db, rebuild=True)
