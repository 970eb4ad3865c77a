"""Bundle bytes stored once per SHA-256 under ``OMNIGENT_DATA_DIR/bundles``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from django.conf import settings


def bundle_path(sha256: str) -> Path:
    return Path(settings.DATA_DIR) / "bundles" / sha256[:2] / f"{sha256}.tar"


def store_bundle(*, sha256: str, data: bytes) -> bool:
    """Write the bytes unless already stored; True when this call created the file."""
    path = bundle_path(sha256)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


class BundleMissing(Exception):
    """The bundle file is not in this server's data directory.

    Every server process must see the same ``OMNIGENT_DATA_DIR``.
    """


def read_bundle(sha256: str) -> bytes:
    try:
        return bundle_path(sha256).read_bytes()
    except FileNotFoundError as exc:
        raise BundleMissing(
            f"bundle {sha256[:12]}… is missing from OMNIGENT_DATA_DIR ({settings.DATA_DIR})"
        ) from exc


def remove_bundle(sha256: str) -> None:
    bundle_path(sha256).unlink(missing_ok=True)
