"""Session file bytes on disk: ``OMNIGENT_DATA_DIR/files/<sha[:2]>/<sha256>``.

Content-addressed, so identical uploads (and every fork of a session) share one file.
Which hashes are still referenced is the database's business (``files.collect_blobs``);
this module only writes, opens and removes bytes.

A write never leaves a partial file under its final name: the bytes go to a temporary
file in ``files/`` (same filesystem as the final place), are flushed and fsynced, and
only then renamed into place (``os.replace`` is atomic), and the directory is fsynced
so the rename survives a crash. A write that fails or is refused removes its
temporary file. A temporary file left by a crashed process starts with ``.upload-``
and can be deleted at any time.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from .file_types import HEAD_BYTES

TEMP_PREFIX = ".upload-"


def files_root() -> Path:
    return Path(settings.DATA_DIR) / "files"


def blob_path(sha256: str) -> Path:
    return files_root() / sha256[:2] / sha256


class TooLarge(Exception):
    """The bytes went past the writer's limit; nothing was kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is larger than {limit} bytes")
        self.limit = limit


class BlobWriter:
    """Bytes streamed to a temporary file, hashed, counted and checked as they come.

    Holds one chunk at a time, never the file: ``write`` raises :class:`TooLarge`
    (and removes the temporary file) as soon as the count passes ``limit``.
    """

    def __init__(self, *, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.head = b""
        self.sha256 = ""
        root = files_root()
        root.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=root, prefix=TEMP_PREFIX)
        self.temp_path = Path(path)
        self._file: BinaryIO | None = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = True

    @property
    def is_text(self) -> bool:
        """Whether every byte so far is valid UTF-8 without NUL (final after ``finish``)."""
        return self._text

    def write(self, chunk: bytes) -> None:
        assert self._file is not None, "the writer is closed"
        self.size += len(chunk)
        if self.size > self.limit:
            self.discard()
            raise TooLarge(self.limit)
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[: HEAD_BYTES - len(self.head)]
        self._hash.update(chunk)
        if self._text:
            try:
                self._utf8.decode(chunk)
            except UnicodeDecodeError:
                self._text = False
            if b"\x00" in chunk:
                self._text = False
        self._file.write(chunk)

    def finish(self) -> str:
        """Flush and fsync the temporary file; returns the SHA-256 (hex)."""
        assert self._file is not None, "the writer is closed"
        if self._text:
            try:
                self._utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                self._text = False
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self.sha256 = self._hash.hexdigest()
        return self.sha256

    def place(self) -> bool:
        """Move the finished bytes to their final name; True if this call created it.

        When the hash is already stored the temporary file is dropped instead. The
        caller holds the hash's ``FileBlob`` row lock, so no collection runs meanwhile.
        """
        assert self.sha256, "finish() first"
        final = blob_path(self.sha256)
        if final.exists():
            self.temp_path.unlink(missing_ok=True)
            return False
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.temp_path, final)
        _fsync_dir(final.parent)
        return True

    def discard(self) -> None:
        """Close and remove the temporary file (safe to call more than once)."""
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None
        self.temp_path.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not fsync directories
    finally:
        os.close(fd)


def open_blob(sha256: str) -> BinaryIO:
    """The stored bytes for reading (FileNotFoundError when missing)."""
    return blob_path(sha256).open("rb")


def read_blob(sha256: str) -> bytes:
    return blob_path(sha256).read_bytes()


def remove_blob(sha256: str) -> None:
    blob_path(sha256).unlink(missing_ok=True)
