"""The development secret key: random, made once per data folder, private, read back."""

from __future__ import annotations

import stat
from pathlib import Path

from omnigent_site.settings import local_secret_key


def test_made_once_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "data" / "secret-key"
    key = local_secret_key(path)
    assert len(key) >= 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_secret_key(path) == key


def test_each_data_folder_gets_its_own_key(tmp_path: Path) -> None:
    assert local_secret_key(tmp_path / "a" / "secret-key") != local_secret_key(
        tmp_path / "b" / "secret-key"
    )
