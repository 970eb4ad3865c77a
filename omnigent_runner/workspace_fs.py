"""The workspace through the server (files.md §2): the blocking file work of the runner.

Every function here does plain blocking I/O and is called through ``asyncio.to_thread``
by :mod:`omnigent_runner.workspace_rpc`, so a large file or a big search never stalls
the event loop that carries the tunnel's heartbeats. Failures raise
:class:`WorkspaceError` with the HTTP status and error code the server answers with.

Confinement is the ``sys_os_*`` tools' own (:func:`~omnigent_runner.tools.fsutil.
resolve_in_root`: joined to the root, symlinks followed, must stay inside), after the
stricter checks of the API: relative paths only, no ``..`` segment, no NUL, no name over
255 bytes and no path over 4,096. Writes inside ``.git`` are refused (403) whether the
path names it or a symlink leads there.

An ``OSError``'s text names the absolute path on this machine; no error leaves here
with it. Every failure names the path as the API gave it (:func:`os_failure`).

Stdlib only: the runner imports this without Django.
"""

from __future__ import annotations

import base64
import codecs
import errno
import fnmatch
import io
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import re2

from omnigent_runner.tools.arguments import ToolError
from omnigent_runner.tools.file_tools import apply_edits, editable_text
from omnigent_runner.tools.fsutil import (
    PathError,
    atomic_write,
    decode_text,
    os_reason,
    resolve_in_root,
)

ENTRY_OBJECT = "session.environment.filesystem.entry"
FILE_OBJECT = "session.environment.filesystem.file"

LIST_DEFAULT_LIMIT = 200
LIST_MAX_LIMIT = 1000
SEARCH_DEFAULT_LIMIT = 100
SEARCH_MAX_LIMIT = 500
SEARCH_MAX_FILES = 20_000
SEARCH_BUDGET_S = 5.0
# A matched line is cut to this many characters in the result; longer lines are
# still searched, up to SEARCH_LINE_SCAN characters each.
SEARCH_TEXT_CHARS = 1000
SEARCH_LINE_SCAN = 64 * 1024
# Files larger than this are not searched (counted as scanned, marked truncated).
SEARCH_FILE_MAX_BYTES = 8 * 1024 * 1024
# The hard ceiling of one read or chunk, whatever the server asks: its base64 must fit
# one frame of the server's default 16 MiB limit with room to spare.
HARD_READ_MAX_BYTES = 8 * 1024 * 1024
# Files recorded one by one when a directory is deleted (agent_edit mode).
DELETE_TRACK_MAX_FILES = 1000
# The longest name (one path component) and the longest path the API takes, in bytes
# of UTF-8: the usual NAME_MAX and PATH_MAX of Linux and macOS file systems. The server
# checks them too, before it relays anything (``workspaces.serializers``).
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096
_SNIFF_BYTES = 8192


class WorkspaceError(Exception):
    """A refused workspace request: ``status`` and ``code`` are the HTTP answer's."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bad_input(message: str) -> WorkspaceError:
    return WorkspaceError(400, "invalid_input", message)


def not_found(path: str) -> WorkspaceError:
    return WorkspaceError(404, "not_found", f"'{path}' not found in the workspace")


# errno -> (status, code) of the answer; anything else is the caller's default.
_ERRNO_ANSWERS = {
    errno.ENOENT: (404, "not_found"),
    errno.EACCES: (403, "forbidden"),
    errno.EPERM: (403, "forbidden"),
    errno.ENAMETOOLONG: (400, "invalid_input"),
    errno.ELOOP: (400, "invalid_input"),
    errno.ENOTDIR: (400, "invalid_input"),
    errno.EISDIR: (409, "conflict"),
    errno.EEXIST: (409, "conflict"),
    errno.ENOTEMPTY: (409, "conflict"),
}


def os_failure(exc: BaseException, rel: str, action: str, *, status: int = 409) -> WorkspaceError:
    """The answer to a failed file operation on ``rel`` (the path as the API names it):
    the status its errno calls for, else ``status``, and never the absolute path."""
    code = "conflict" if status == 409 else "invalid_input"
    if isinstance(exc, OSError) and exc.errno in _ERRNO_ANSWERS:
        status, code = _ERRNO_ANSWERS[exc.errno]
    return WorkspaceError(status, code, f"cannot {action} '{rel}': {os_reason(exc)}")


def path_length_problem(path: str) -> str | None:
    """Why ``path`` is too long for a file system, or None (lengths in UTF-8 bytes)."""
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > PATH_MAX_BYTES:
        return f"the path is {size} bytes long; the limit is {PATH_MAX_BYTES} bytes"
    if size > NAME_MAX_BYTES:
        for part in path.split("/"):
            length = len(part.encode("utf-8", "surrogatepass"))
            if length > NAME_MAX_BYTES:
                return (
                    f"a name in the path is {length} bytes long; the limit is "
                    f"{NAME_MAX_BYTES} bytes per name"
                )
    return None


# --- confinement -----------------------------------------------------------------------


def check_api_path(path: Any, *, allow_root: bool = True) -> str:
    """The API's path rules before any resolving: relative, no ``..``, no NUL, names and
    the whole path within :data:`NAME_MAX_BYTES` and :data:`PATH_MAX_BYTES`.

    Returns the path normalised ("." for the root). ``\\`` counts as a separator for
    the ``..`` rule, so a Windows-style path cannot sneak a parent segment through.
    """
    if not isinstance(path, str):
        raise bad_input("'path' must be a string")
    if "\x00" in path:
        raise bad_input("the path must not contain NUL characters")
    too_long = path_length_problem(path)
    if too_long:
        raise bad_input(too_long)
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise bad_input("the path must be relative to the workspace root")
    if ".." in path.replace("\\", "/").split("/"):
        raise bad_input("the path must not contain '..'")
    clean = PurePosixPath(path).as_posix() if path else "."
    if clean == "." and not allow_root:
        raise bad_input("the path must name something inside the workspace root")
    return clean


def confine(root: Path, path: Any, *, write: bool = False) -> tuple[Path, str]:
    """Resolve an API path inside ``root`` with the ``sys_os_*`` tools' confinement.

    Returns the resolved absolute path and its posix path relative to the root.
    Raises 400 for a path that is absolute, has ``..`` or NUL, or resolves (symlinks
    included) outside the root, and 403 for a write that lands inside ``.git``.
    """
    clean = check_api_path(path, allow_root=not write)
    try:
        target, rel = resolve_in_root(root, clean)
    except PathError as exc:
        raise bad_input(str(exc)) from None
    if write and (_in_git_dir(clean) or _in_git_dir(rel)):
        raise WorkspaceError(
            403, "forbidden", f"'{clean}' is inside .git: writes there are refused"
        )
    if write and rel == ".":
        raise bad_input("the workspace root itself cannot be written or deleted")
    return target, rel


def confine_entry(root: Path, path: Any) -> tuple[Path, str]:
    """For a delete: the path itself (a final symlink not followed), inside ``root``.

    The parent is resolved with the tools' confinement, so the entry removed always
    lives inside the root even when its parent is reached through a symlink; the
    target of a final symlink must resolve inside the root too (:func:`confine`).
    """
    confine(root, path, write=True)
    clean = check_api_path(path, allow_root=False)
    pure = PurePosixPath(clean)
    parent, parent_rel = confine(root, pure.parent.as_posix())
    rel = pure.name if parent_rel == "." else f"{parent_rel}/{pure.name}"
    if _in_git_dir(rel):
        raise WorkspaceError(
            403, "forbidden", f"'{clean}' is inside .git: writes there are refused"
        )
    return parent / pure.name, rel


def _in_git_dir(rel: str) -> bool:
    return any(part.casefold() == ".git" for part in PurePosixPath(rel).parts)


# --- shapes ------------------------------------------------------------------------------


def _entry(path: str, name: str, st: os.stat_result) -> dict[str, Any]:
    mode = st.st_mode
    kind = "symlink" if stat.S_ISLNK(mode) else "directory" if stat.S_ISDIR(mode) else "file"
    return {
        "object": ENTRY_OBJECT,
        "path": path,
        "name": name,
        "type": kind,
        "bytes": st.st_size if kind == "file" else None,
        "modified_at": int(st.st_mtime),
    }


def entry_of(root: Path, rel: str) -> dict[str, Any]:
    """The entry of an existing path (not following a final symlink)."""
    target = root.resolve() / rel
    st = os.lstat(target)
    return _entry(rel, PurePosixPath(rel).name, st)


# --- reads -------------------------------------------------------------------------------


def stat_target(root: Path, path: Any) -> tuple[Path, str, os.stat_result]:
    target, rel = confine(root, path)
    try:
        st = target.stat()
    except FileNotFoundError:
        raise not_found(rel) from None
    except OSError as exc:
        raise os_failure(exc, rel, "read", status=400) from None
    return target, rel, st


def list_or_read(
    root: Path, path: Any, *, limit: Any = None, after: Any = None, max_bytes: int
) -> dict[str, Any]:
    """``workspace.list`` / ``workspace.read``: a directory's listing, or a file."""
    target, rel, st = stat_target(root, path)
    if stat.S_ISDIR(st.st_mode):
        return list_directory(target, rel, limit=limit, after=after)
    if not stat.S_ISREG(st.st_mode):
        raise bad_input(f"'{rel}' is neither a file nor a directory")
    return read_file(target, rel, st, max_bytes=max_bytes)


def _limit(value: Any, default: int, maximum: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise bad_input(f"'limit' must be an integer between 1 and {maximum}")
    return value


def list_directory(target: Path, rel: str, *, limit: Any, after: Any) -> dict[str, Any]:
    """Directories first, then by name; ``after`` is the last name of the previous page.

    A name given as ``after`` that no longer exists is placed as a file would be (the
    listing's second group), so a page is never repeated from the start.
    """
    count = _limit(limit, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT)
    if after is not None and not isinstance(after, str):
        raise bad_input("'after' must be a string")
    keyed: list[tuple[tuple[int, str], os.DirEntry[str]]] = []
    try:
        with os.scandir(target) as scan:
            for item in scan:
                try:
                    is_dir = item.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                keyed.append(((0 if is_dir else 1, item.name), item))
    except OSError as exc:
        raise os_failure(exc, rel, "list", status=400) from None
    keyed.sort(key=lambda pair: pair[0])
    start = 0
    if after:
        group = next((key[0] for key, _ in keyed if key[1] == after), 1)
        start = next((i for i, (key, _) in enumerate(keyed) if key > (group, after)), len(keyed))
    page = keyed[start : start + count]
    prefix = "" if rel == "." else rel + "/"
    data = []
    for _, item in page:
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue  # removed while listing
        data.append(_entry(prefix + item.name, item.name, st))
    return {
        "object": "list",
        "data": data,
        "has_more": start + count < len(keyed),
        "last_id": data[-1]["name"] if data else None,
    }


def read_file(target: Path, rel: str, st: os.stat_result, *, max_bytes: int) -> dict[str, Any]:
    """The file object: text as utf-8, anything else as base64, cut at ``max_bytes``."""
    cap = max(0, min(max_bytes, HARD_READ_MAX_BYTES))
    try:
        with open(target, "rb") as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise os_failure(exc, rel, "read", status=400) from None
    truncated = len(data) > cap
    data = data[:cap]
    text = _text_prefix(data) if truncated else decode_text(data)
    if text is None:
        encoding, content = "base64", base64.b64encode(data).decode("ascii")
    else:
        encoding, content = "utf-8", text
    return {
        "object": FILE_OBJECT,
        "path": rel,
        "bytes": st.st_size,
        "modified_at": int(st.st_mtime),
        "encoding": encoding,
        "content": content,
        "truncated": truncated,
    }


def _text_prefix(data: bytes) -> str | None:
    """The text of a cut file: a multi-byte character split by the cut is left out."""
    if b"\x00" in data:
        return None
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return None


def read_chunk(root: Path, path: Any, *, offset: Any, length: Any) -> dict[str, Any]:
    """``workspace.read_chunk``: ``length`` bytes from ``offset``, base64, for downloads."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_input("'offset' must be a non-negative integer")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise bad_input("'length' must be a positive integer")
    length = min(length, HARD_READ_MAX_BYTES)
    target, rel, st = stat_target(root, path)
    if not stat.S_ISREG(st.st_mode):
        raise bad_input(f"'{rel}' is not a file")
    try:
        with open(target, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
    except OSError as exc:
        raise os_failure(exc, rel, "read", status=400) from None
    return {
        "path": rel,
        "bytes": st.st_size,
        "modified_at_ns": st.st_mtime_ns,
        "offset": offset,
        "data": base64.b64encode(data).decode("ascii"),
        "eof": offset + len(data) >= st.st_size,
    }


# --- writes ------------------------------------------------------------------------------


def decode_content(content: Any, encoding: Any, *, max_bytes: int) -> bytes:
    if not isinstance(content, str):
        raise bad_input("'content' must be a string")
    if encoding not in (None, "utf-8", "base64"):
        raise bad_input("'encoding' must be 'utf-8' or 'base64'")
    if encoding == "base64":
        try:
            data = base64.b64decode(content, validate=True)
        except ValueError:
            raise bad_input("'content' is not valid base64") from None
    else:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_input("'content' is not encodable as UTF-8") from None
    if len(data) > max_bytes:
        raise WorkspaceError(
            413, "payload_too_large", f"the content is over the {max_bytes}-byte limit"
        )
    return data


def write_file(target: Path, rel: str, data: bytes, *, create_parents: bool) -> None:
    try:
        if target.is_dir():
            raise WorkspaceError(409, "conflict", f"'{rel}' is a directory")
        parent = target.parent
        if not parent.is_dir():
            if not create_parents:
                raise WorkspaceError(
                    409,
                    "conflict",
                    f"the parent folder of '{rel}' does not exist (create_parents)",
                )
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_failure(exc, rel, "create the parent of") from None
        atomic_write(target, data)
    except OSError as exc:
        raise os_failure(exc, rel, "write") from None


def edit_file(target: Path, rel: str, old: str, new: str, *, replace_all: bool) -> None:
    """The ``sys_os_edit`` matching rules (plus ``replace_all``), all or nothing."""
    try:
        if not target.exists():
            raise not_found(rel)
        if target.is_dir():
            raise bad_input(f"'{rel}' is a directory, not a file")
        text = apply_edits(
            editable_text(target, rel), [(old, new)], single=True, replace_all=replace_all
        )
        atomic_write(target, text.encode("utf-8"))
    except ToolError as exc:
        raise bad_input(str(exc)) from None
    except OSError as exc:
        raise os_failure(exc, rel, "write") from None


def delete_path(target: Path, rel: str, *, recursive: bool) -> None:
    """Remove a file, a symlink (not its target) or a directory (``recursive`` if not empty)."""
    link = target
    try:
        st = os.lstat(link)
    except FileNotFoundError:
        raise not_found(rel) from None
    except OSError as exc:
        raise os_failure(exc, rel, "delete") from None
    try:
        if stat.S_ISDIR(st.st_mode):
            if any(os.scandir(link)):
                if not recursive:
                    raise WorkspaceError(
                        409, "conflict", f"'{rel}' is not empty (use recursive=true)"
                    )
                shutil.rmtree(link)
            else:
                os.rmdir(link)
        else:
            os.unlink(link)
    except OSError as exc:
        raise os_failure(exc, rel, "delete") from None


def files_under(target: Path, rel: str, *, cap: int = DELETE_TRACK_MAX_FILES) -> list[str]:
    """Root-relative paths of the regular files in a directory (at most ``cap``)."""
    found: list[str] = []
    for directory, dirs, files in os.walk(target):
        dirs[:] = [d for d in dirs if d != ".git"]
        base = Path(directory).relative_to(target).as_posix()
        for name in files:
            found.append(f"{rel}/{name}" if base == "." else f"{rel}/{base}/{name}")
            if len(found) >= cap:
                return found
    return found


# --- search ------------------------------------------------------------------------------


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the client's 400, not a log line
    return options


_RE2_OPTIONS = _re2_options()
RE2_UNSUPPORTED = "backreferences, lookahead, lookbehind, atomic groups or possessive quantifiers"


# A pattern that needs the line's own ends: ``\A``/``\z`` (the file's ends in a whole-file
# search) or a flag group turning an option off (``(?-m)``, ``(?i-m:…)``).
_LINE_BOUND = re.compile(r"\\[Az]|\(\?[A-Za-z]*-")


@dataclass(frozen=True)
class LineMatcher:
    """How a search matches: ``line`` on one line of text (the answer), ``file`` on a
    whole file's bytes, False only when no line of it can match (a cheap first pass
    that skips most files with one call instead of one per line)."""

    line: Callable[[str], Any]
    file: Callable[[bytes], bool]


def literal_matcher(query: str) -> LineMatcher:
    needle = query.encode("utf-8")
    return LineMatcher(line=lambda text: query in text, file=lambda data: needle in data)


def compile_search_pattern(query: str) -> LineMatcher:
    """``q`` as a regular expression, matched in time linear in the text (RE2).

    Python's ``re`` backtracks: ``(a+)+$`` on a line of 28 ``a`` and a ``!`` held the
    interpreter for minutes, in a worker thread but with the GIL, so every session on
    the runner stalled behind one search (the 5 s budget is only checked between
    lines). RE2 never backtracks; the price is that it refuses what needs backtracking.

    RE2's Python binding costs microseconds a call, so each file is first searched
    whole, in multi-line mode (``^`` and ``$`` at every line's ends, as on a line
    alone); only a file where that finds something is searched line by line. Where
    the whole-file pass could miss a line's match (``\\A``, ``\\z``, an option turned
    off, a ``\\r`` before a line's end) every file is searched line by line.
    """
    try:
        pattern = re2.compile(query, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "backslashreplace")
        raise bad_input(
            f"'q' is not a regular expression this search takes: {reason} (RE2 syntax, "
            f"matched in linear time: no {RE2_UNSUPPORTED})"
        ) from None
    if _LINE_BOUND.search(query):
        return LineMatcher(line=pattern.search, file=lambda data: True)
    whole = re2.compile("(?m)" + query, _RE2_OPTIONS)

    def file_may_match(data: bytes) -> bool:
        return b"\r" in data or whole.search(data) is not None

    return LineMatcher(line=pattern.search, file=file_may_match)


def search(
    root: Path,
    *,
    query: Any,
    path: Any = None,
    glob: Any = None,
    regex: bool = False,
    limit: Any = None,
    budget_s: float = SEARCH_BUDGET_S,
    max_files: int = SEARCH_MAX_FILES,
) -> dict[str, Any]:
    """Lines matching ``query`` in the text files under ``path``, bounded three ways.

    At most ``max_files`` files scanned, ``limit`` results and ``budget_s`` seconds;
    hitting any bound sets ``truncated``. ``.git`` folders, symlinked folders,
    binary files (NUL byte or not UTF-8) and files over 8 MiB are skipped. ``glob``
    matches the path relative to the root when it has a ``/``, else the file name.
    """
    if not isinstance(query, str) or not query:
        raise bad_input("'q' must be a non-empty string")
    if glob is not None and not isinstance(glob, str):
        raise bad_input("'glob' must be a string")
    count = _limit(limit, SEARCH_DEFAULT_LIMIT, SEARCH_MAX_LIMIT)
    matches = compile_search_pattern(query) if regex else literal_matcher(query)

    start, rel_start, st = stat_target(root, path or ".")
    real_root = root.resolve()
    deadline = time.monotonic() + budget_s
    results: list[dict[str, Any]] = []
    scanned = 0
    truncated = False
    if stat.S_ISREG(st.st_mode):
        candidates: Any = [(start, rel_start)]
    else:
        candidates = _walk(start, real_root)
    for file_path, rel in candidates:
        if glob and not fnmatch.fnmatchcase(rel if "/" in glob else PurePosixPath(rel).name, glob):
            continue
        if scanned >= max_files or time.monotonic() > deadline:
            truncated = True
            break
        scanned += 1
        outcome = _search_file(file_path, rel, matches, results, count, deadline)
        if outcome:
            truncated = True
            break
    return {"object": "list", "data": results, "truncated": truncated}


def _walk(start: Path, real_root: Path) -> Any:
    """(absolute path, root-relative path) of regular files, in a stable order."""
    for directory, dirs, files in os.walk(start):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        base = Path(directory)
        for name in sorted(files):
            file_path = base / name
            if file_path.is_symlink():
                try:
                    resolved = file_path.resolve(strict=True)
                except (OSError, RuntimeError):
                    continue
                if real_root not in resolved.parents:
                    continue  # a link that leaves the workspace is not followed
            yield file_path, file_path.relative_to(real_root).as_posix()


def _search_file(
    file_path: Path,
    rel: str,
    matches: LineMatcher,
    results: list[dict[str, Any]],
    limit: int,
    deadline: float,
) -> bool:
    """Append the file's matching lines; True when a bound (results, time) was hit."""
    try:
        with open(file_path, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return False
            if os.fstat(fh.fileno()).st_size > SEARCH_FILE_MAX_BYTES:
                return False
            data = fh.read(SEARCH_FILE_MAX_BYTES + 1)
    except OSError:
        return False
    if b"\x00" in data[:_SNIFF_BYTES] or not matches.file(data):
        return False
    decoder = codecs.getincrementaldecoder("utf-8")()
    for number, raw in enumerate(io.BytesIO(data), start=1):
        try:
            line = decoder.decode(raw)
        except UnicodeDecodeError:
            return False  # binary after all; its earlier matches stand
        line = line.rstrip("\r\n")
        if matches.line(line[:SEARCH_LINE_SCAN]):
            results.append({"path": rel, "line": number, "text": line[:SEARCH_TEXT_CHARS]})
            if len(results) >= limit:
                return True
        if number % 1000 == 0 and time.monotonic() > deadline:
            return True
    return False
