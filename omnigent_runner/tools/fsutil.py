"""Filesystem helpers shared by the ``sys_os_*`` tools and the change trackers.

Both sides must agree on two things, so they live here once:

* **Confinement**: which absolute file a tool path names, and whether it stays inside
  the tool root. The trackers resolve paths exactly as the tools do, so a change is
  attributed to the file the tool really touched (symlinks followed).
* **What counts as text**: a file is text when it is valid UTF-8 without NUL bytes. The
  read tool, the diff baselines and the line counts all use this one definition.

Stdlib only: the runner imports this without Django.
"""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Largest file whose text is kept as a diff baseline or sent as ``before``/``after``.
MAX_TEXT_BYTES = 1024 * 1024

_CHUNK = 64 * 1024


class PathError(Exception):
    """A tool path that cannot be used; the message is shown to the model as is."""


def outside_root_message(path: str) -> str:
    """The contract's wording for a path that escapes the root (agents.md)."""
    return f"Access to '{path}' is blocked: path is outside the workspace root"


def resolve_in_root(root: Path, path: str) -> tuple[Path, str]:
    """Resolve a tool ``path`` against ``root`` and check it stays inside.

    Returns the resolved absolute path and its posix path relative to the resolved
    root ("." for the root itself). Symlinks are followed (``strict=False`` so a file
    about to be created resolves too), which is what blocks a link inside the root
    that points outside it. Raises :class:`PathError` with the caller's path in the
    message.
    """
    if not isinstance(path, str) or not path:
        raise PathError("'path' must be a non-empty string")
    if "\x00" in path:
        raise PathError("'path' must not contain NUL characters")
    real_root = root.resolve()
    try:
        resolved = (real_root / path).resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable dirs
        raise PathError(f"Cannot resolve '{path}': {os_reason(exc)}") from exc
    if resolved != real_root and real_root not in resolved.parents:
        raise PathError(outside_root_message(path))
    return resolved, resolved.relative_to(real_root).as_posix()


def os_reason(exc: BaseException) -> str:
    """Why a file operation failed, without the absolute path ``str(exc)`` carries.

    ``OSError`` and pathlib's symlink-loop ``RuntimeError`` name the machine's absolute
    path; messages that leave the runner (to the model, to the server) name the path
    the caller gave instead, and take only the reason from here.
    """
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, RuntimeError) and "symlink loop" in str(exc).lower():
        return "Too many levels of symbolic links"
    return type(exc).__name__


def decode_text(data: bytes) -> str | None:
    """Return ``data`` as text, or None when it is binary (NUL byte or not UTF-8)."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_text_capped(path: Path, cap: int = MAX_TEXT_BYTES) -> str | None:
    """The text of a regular file of at most ``cap`` bytes, else None.

    None covers every reason the content cannot serve as a diff side: missing,
    not a regular file, too large, binary or unreadable.
    """
    try:
        with open(path, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            data = fh.read(cap + 1)
    except OSError:
        return None
    if len(data) > cap:
        return None
    return decode_text(data)


def count_lines(text: str) -> int:
    """Lines as git's numstat counts them: a last line without newline still counts."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def count_file_lines(path: Path) -> int | None:
    """Line count of a text file of any size, streamed; None if binary or unreadable."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = 0
    last = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                if b"\x00" in chunk:
                    return None
                decoder.decode(chunk)
                lines += chunk.count(b"\n")
                last = chunk
            decoder.decode(b"", final=True)
    except (OSError, UnicodeDecodeError):
        return None
    if last and not last.endswith(b"\n"):
        lines += 1
    return lines


@dataclass(frozen=True)
class FileState:
    """What the change records report about a file as it is now."""

    exists: bool
    size: int | None = None
    mtime_ns: int | None = None

    @property
    def modified_at(self) -> int | None:
        return None if self.mtime_ns is None else self.mtime_ns // 1_000_000_000


def file_state(path: Path) -> FileState:
    """Size and mtime of a regular file; a missing path (or a directory) is absent."""
    try:
        st = path.stat()
    except OSError:
        return FileState(exists=False)
    if not stat.S_ISREG(st.st_mode):
        return FileState(exists=False)
    return FileState(exists=True, size=st.st_size, mtime_ns=st.st_mtime_ns)


def _current_umask() -> int:
    """The process umask, read once: new files get the mode ``open()`` would give them."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()
# Longest target name kept in the temporary file's name (NAME_MAX 255 less its dots,
# the random part and ``.tmp``).
_TMP_NAME_ROOM = 200


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers never see a half-written file.

    The bytes go to a temporary file in the same directory (same filesystem, so
    ``os.replace`` is atomic) that is then renamed over the target. An existing
    file keeps its permission bits; a new one gets the umask default.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    # The temporary file's name adds about 14 bytes to the target's: a long name (up to
    # the 255 bytes a file system takes) gets a short one instead.
    short = len(os.fsencode(path.name)) <= _TMP_NAME_ROOM
    prefix = f".{path.name}." if short else ".omnigent-write."
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
