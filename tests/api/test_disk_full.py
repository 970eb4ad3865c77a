"""The data directory's disk full (operations.md, "Accidents survived"): uploads are
refused with a clear error (507 ``insufficient_storage``), nothing half-written stays
behind, and reads go on. The data directory is a real 1 MiB tmpfs (mounting one needs
root; elsewhere the test skips, and fails in CI)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from sessions.models import Session, SessionFile

from .conftest import ALICE, assert_error, upload

pytestmark = pytest.mark.django_db

TMPFS_BYTES = 1024 * 1024


@pytest.fixture
def full_disk(tmp_path: Path, settings: object) -> Iterator[Path]:
    """``settings.DATA_DIR`` on a fresh 1 MiB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mounted.returncode != 0:
        message = f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (CI=true requires it)")
        pytest.skip(message)
    try:
        settings.DATA_DIR = mount_point  # type: ignore[attr-defined]
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def fill(path: Path) -> None:
    """Write ``path`` until the disk is full."""
    with path.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError:
            pass


def files_under(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def test_uploads_to_a_full_disk_are_507_and_leave_nothing(
    full_disk: Path,
    client_for: Callable[[str | None], object],
    create_session: Callable[..., str],
    make_bundle: Callable[..., bytes],
) -> None:
    client = client_for(ALICE)
    session_id = create_session()  # its bundle fits
    small = client.post(  # type: ignore[attr-defined]
        f"/v1/sessions/{session_id}/resources/files",
        {"file": upload(b"fits\n" * 100, "small.txt")},
        format="multipart",
    )
    assert small.status_code == 201, small.content
    before = files_under(full_disk)

    too_big = b"x" * (TMPFS_BYTES + 4096)
    refused = client.post(  # type: ignore[attr-defined]
        f"/v1/sessions/{session_id}/resources/files",
        {"file": upload(too_big, "big.txt")},
        format="multipart",
    )
    error = assert_error(refused, 507, "insufficient_storage", mentions="storage is full")
    assert "nothing was stored" in error["message"]
    assert files_under(full_disk) == before
    assert SessionFile.objects.filter(session_id=session_id).count() == 1

    # A bundle when not one more byte fits: no session, no agent file.
    sessions = Session.objects.count()
    fill(full_disk / "filler")
    before = files_under(full_disk)
    refused_bundle = client.post(  # type: ignore[attr-defined]
        "/v1/sessions",
        {"metadata": json.dumps({}), "bundle": upload(make_bundle("another"))},
        format="multipart",
    )
    assert_error(refused_bundle, 507, "insufficient_storage")
    assert Session.objects.count() == sessions
    assert files_under(full_disk) == before

    # Reads go on.
    assert client.get(f"/v1/sessions/{session_id}").status_code == 200  # type: ignore[attr-defined]
    listing = client.get(f"/v1/sessions/{session_id}/resources/files")  # type: ignore[attr-defined]
    assert listing.status_code == 200
    assert settings.DATA_DIR == full_disk
