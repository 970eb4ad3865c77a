"""``testing.processes.migrate``: a fresh SQLite file is a copy of one migrated once per
process, and that copy is what ``manage.py migrate`` itself would have made."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from testing import processes
from testing.processes import base_env, migrate, migrated_sqlite_template

pytestmark = pytest.mark.timeout(120)


def _schema(path: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {
            "objects": sorted(
                db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(),
                key=repr,
            ),
            "migrations": sorted(db.execute("SELECT app, name FROM django_migrations")),
            "integrity": db.execute("PRAGMA integrity_check").fetchone(),
        }


def test_a_fresh_sqlite_file_is_a_copy_equal_to_a_fresh_migrate(tmp_path: Path) -> None:
    copied = tmp_path / "copied" / "db.sqlite3"
    migrate(base_env(DATABASE_URL=f"sqlite:///{copied}"), tmp_path)
    assert migrated_sqlite_template(base_env()) != copied

    fresh = tmp_path / "fresh.sqlite3"
    processes._run_migrate(base_env(DATABASE_URL=f"sqlite:///{fresh}"))
    expected = _schema(fresh)
    assert expected["migrations"], "manage.py migrate applied no migration"
    assert _schema(copied) == expected
    assert expected["integrity"] == ("ok",)


def test_an_existing_file_and_other_databases_go_through_manage_py_migrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(processes, "_run_migrate", lambda env: ran.append(env["DATABASE_URL"]))
    existing = tmp_path / "existing.sqlite3"
    existing.touch()
    for url in (
        f"sqlite:///{existing}",
        "postgres://postgres@127.0.0.1:5432/test",
        "sqlite:///relative.sqlite3",
    ):
        migrate(base_env(DATABASE_URL=url), tmp_path)
    assert ran == [
        f"sqlite:///{existing}",
        "postgres://postgres@127.0.0.1:5432/test",
        "sqlite:///relative.sqlite3",
    ]
    assert existing.stat().st_size == 0
