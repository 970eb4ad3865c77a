"""The database configuration derived from ``DATABASE_URL`` (docs/configuration.md).

Settings are read once per process, so each case runs Django in a fresh one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PG_URL = "postgres://postgres@127.0.0.1:5432/test"  # parsed only: nothing connects
pytestmark = pytest.mark.timeout(120)


def database_settings(tmp_path: Path, **extra: str) -> dict[str, object]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "OMNIGENT_", "DATABASE_", "REDIS_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="omnigent_site.settings",
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(REPO),
        **extra,
    )
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        "d = settings.DATABASES['default']; "
        "print(json.dumps({'ENGINE': d['ENGINE'], 'OPTIONS': d.get('OPTIONS', {})}, default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_sqlite_uses_the_backend_that_queues_writers(tmp_path: Path) -> None:
    db = database_settings(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert db["ENGINE"] == "omnigent_site.runtime.sqlite3"
    options = db["OPTIONS"]
    assert isinstance(options, dict)
    assert options["transaction_mode"] == "IMMEDIATE"


def test_postgresql_binds_parameters_on_the_server_unless_turned_off(tmp_path: Path) -> None:
    on = database_settings(tmp_path, DATABASE_URL=PG_URL)
    assert on["ENGINE"] == "django.db.backends.postgresql"
    assert isinstance(on["OPTIONS"], dict) and on["OPTIONS"]["server_side_binding"] is True
    off = database_settings(tmp_path, DATABASE_URL=PG_URL, DATABASE_SERVER_SIDE_BINDING="0")
    assert isinstance(off["OPTIONS"], dict) and off["OPTIONS"]["server_side_binding"] is False
