"""Agent bundles: check an uploaded tar archive and load the agent spec it holds.

The server validates uploads with this module before storing anything, and the runner
loads agents from the stored bytes with the very same code, so both always agree on
what a bundle means. The runner has no Django, hence this module imports only the
standard library and PyYAML, never Django.

Archives are read in memory and never extracted, so a hostile entry cannot touch the
file system; links and special files are refused anyway, because a bundle that needs
them is not an agent bundle. The rules come from ``shared/spec/agents.md`` ("Bundles").
"""

from __future__ import annotations

import gzip as gzip_module
import hashlib
import io
import logging
import math
import re
import tarfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

try:
    from yaml._yaml import CParser  # libyaml's parser, as yaml.cyaml imports it
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    CParser = None  # type: ignore[assignment,misc]

from omnigent_runner.mcp_spec import McpDeclarationError, McpServerSpec, parse_servers, redact_raw
from omnigent_runner.policies import NO_GUARDRAILS, Guardrails, RuleError, parse_guardrails
from omnigent_runner.tools.sys_os import TOOL_NAMES as BUILTIN_TOOL_NAMES

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_MAX_UNPACKED_BYTES = 64 * 1024 * 1024
# The agent YAML itself (agents.md): a spec is a page, not a book. Checked before parsing.
DEFAULT_MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_BYTES_ENV = "OMNIGENT_MAX_AGENT_YAML_BYTES"
DEFAULT_MAX_ITERATIONS = 50
MAX_ITERATIONS_CAP = 1000
DEFAULT_TIMEOUT = 600.0
APIS = ("responses", "chat_completions")
TOOL_CHOICE_MODES = ("auto", "required", "none")
# A function name as OpenAI's APIs accept it.
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
KNOWN_KEYS = frozenset(
    {
        "spec_version",
        "name",
        "description",
        "prompt",
        "instructions",
        "executor",
        "os_env",
        "guardrails",
        "tools",
    }
)

MASK = "***"
# Keys whose scalar values public_dict() masks wherever they appear: bundles written
# for richer agent systems may carry tokens of their own under unknown keys.
_SECRET_KEY_RE = re.compile(r"(?:^|[_-])(?:api_?key|secret|password|passwd|token)$", re.I)
# A few kilobytes of YAML can expand, through aliases, to billions of values:
# _BoundedLoader stops composing past this many (each alias counts what it stands for).
_MAX_YAML_NODES = 100_000
_MAX_YAML_DEPTH = 64
# YAML escapes can produce NUL (PostgreSQL cannot store it) and lone surrogates (UTF-8
# cannot encode them); a spec holding either could be accepted but never stored or sent.
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")
# Tar headers (pax records, long names) are read by tarfile itself, outside the
# per-file size checks; this allowance bounds them while staying far above real use.
_HEADER_ALLOWANCE_PER_ENTRY = 4096
_HEADER_ALLOWANCE = 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


class BundleError(ValueError):
    """A bundle was rejected; ``str(exc)`` is a human message naming the problem.

    ``field`` is the spec path at fault when one is known (``tools.git.args``)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class OsEnv:
    """Where the runner's ``sys_os_*`` tools operate (present only when the spec asks)."""

    type: str
    cwd: str
    sandbox_type: str


@dataclass(frozen=True)
class AgentSpec:
    """The agent spec fields this project implements, checked and with defaults applied."""

    name: str
    description: str
    prompt: str
    model: str | None
    api: str
    api_key: str | None = field(repr=False)  # a secret: keep it out of logs and tracebacks
    base_url: str | None
    max_iterations: int
    timeout: float
    os_env: OsEnv | None
    unknown_keys: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The checked ``guardrails`` block (approvals.md); its rules are data, never code.
    guardrails: Guardrails = NO_GUARDRAILS
    # ``executor.tool_choice``: a mode or a tool name; None leaves it to the server.
    tool_choice: str | None = None
    # ``tools:`` entries with ``type: mcp`` (mcp.md), in declaration order.
    mcp_servers: tuple[McpServerSpec, ...] = ()

    def public_dict(self) -> dict[str, Any]:
        """Every field as JSON-safe data with the API key masked, for storing and returning.

        ``raw`` is a copy of the YAML mapping with ``executor.auth.api_key`` (and any
        other secret-named key) replaced by ``"***"``; the key's text is also scrubbed
        from every other string, so the secret appears nowhere in the result. MCP
        servers' header and env values are ``"[REDACTED]"`` in ``raw`` (and URL
        credentials gone) and absent from ``mcp_servers``.
        """
        raw = self.raw
        if "tools" in raw:
            raw = {**raw, "tools": redact_raw(raw["tools"])}
        summary = {
            "name": self.name,
            "description": self.description,
            "prompt": self.prompt,
            "model": self.model,
            "api": self.api,
            "api_key": self.api_key,  # masked by _jsonable (secret-named key)
            "base_url": self.base_url,
            "max_iterations": self.max_iterations,
            "timeout": self.timeout,
            "tool_choice": self.tool_choice,
            "os_env": None if self.os_env is None else vars(self.os_env).copy(),
            "unknown_keys": list(self.unknown_keys),
            "guardrails": self.guardrails.as_json(),
            "mcp_servers": [server.public_dict() for server in self.mcp_servers],
            "raw": raw,
        }
        return _jsonable(summary, secret=self.api_key, budget=[_MAX_YAML_NODES * 2])


@dataclass(frozen=True)
class Bundle:
    """A validated bundle: its spec and the identity of the exact uploaded bytes."""

    spec: AgentSpec
    sha256: str
    layout: str  # "single_file" | "directory"
    size: int


def parse_bundle(
    data: bytes,
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
    max_yaml_bytes: int = DEFAULT_MAX_YAML_BYTES,
) -> Bundle:
    """Validate ``data`` (a gzip or plain tar) and load its agent; raise BundleError if bad."""
    files = _read_files(data, max_entries=max_entries, max_unpacked_bytes=max_unpacked_bytes)
    layout, spec_path = _find_spec_file(files)
    if len(files[spec_path]) > max_yaml_bytes:
        raise BundleError(
            f"{spec_path!r} is {len(files[spec_path])} bytes; an agent YAML may hold at most "
            f"{max_yaml_bytes} bytes"
        )
    raw = _load_yaml(files[spec_path], spec_path)
    spec = _build_spec(raw, files=files, layout=layout, source=spec_path)
    return Bundle(spec=spec, sha256=hashlib.sha256(data).hexdigest(), layout=layout, size=len(data))


def max_yaml_bytes_from(env: Mapping[str, str]) -> int:
    """The agent YAML cap from ``OMNIGENT_MAX_AGENT_YAML_BYTES`` in ``env``, else 1 MiB.

    The runner reads it from its environment, so a server whose cap was raised can set
    the same value for its runners; ValueError names the variable when it is not a
    positive integer.
    """
    raw = env.get(MAX_YAML_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_YAML_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_YAML_BYTES_ENV} must be a positive integer, got {raw!r}")
    return value


def build_bundle(files: Mapping[str, bytes | str], *, gzip: bool = True) -> bytes:
    """Pack ``path -> content`` into a tar (gzip by default) in memory.

    For tests and the demo. The output is deterministic (fixed mtimes), so equal inputs
    give equal SHA-256s.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, content in files.items():
            payload = content.encode("utf-8") if isinstance(content, str) else content
            info = tarfile.TarInfo(path)
            info.size = len(payload)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(payload))
    tar_bytes = buffer.getvalue()
    return gzip_module.compress(tar_bytes, mtime=0) if gzip else tar_bytes


# --- reading the archive ---------------------------------------------------------------


class _CappedReader(io.RawIOBase):
    """A read-only stream of the (decompressed) tar bytes that refuses to go past ``limit``.

    tarfile reads pax and long-name headers in one piece of whatever size they claim; a
    gzip bomb hidden there would otherwise be inflated into memory before any of our
    per-file checks could run.
    """

    def __init__(self, source: io.BufferedIOBase, *, limit: int) -> None:
        super().__init__()
        self._source = source
        self._limit = limit
        self._count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        room = self._limit - self._count + 1  # one byte more, to notice the overflow
        chunk = self._source.read(room if size is None or size < 0 else min(size, room))
        self._count += len(chunk)
        if self._count > self._limit:
            raise BundleError(
                f"bundle is too large when unpacked (over {self._limit} bytes of tar data)"
            )
        return chunk


def _read_files(data: bytes, *, max_entries: int, max_unpacked_bytes: int) -> dict[str, bytes]:
    """Check every entry and return the regular files as ``normalised path -> bytes``."""
    if not data:
        raise BundleError("bundle is empty (expected a gzip or plain tar archive)")
    source: io.BufferedIOBase = io.BytesIO(data)
    if data.startswith(_GZIP_MAGIC):
        source = gzip_module.GzipFile(fileobj=source, mode="rb")
    limit = max_unpacked_bytes + (max_entries + 1) * _HEADER_ALLOWANCE_PER_ENTRY + _HEADER_ALLOWANCE
    files: dict[str, bytes] = {}
    unpacked = 0
    try:
        # Stream mode ("r|") reads entries one by one, so a huge archive is rejected at
        # entry max_entries + 1 without its member list ever being loaded.
        with tarfile.open(fileobj=_CappedReader(source, limit=limit), mode="r|") as archive:
            for count, member in enumerate(archive, start=1):
                if count > max_entries:
                    raise BundleError(f"bundle has more than {max_entries} entries")
                path = _entry_path(member.name)
                _check_entry_type(member)
                if member.isdir():
                    continue
                if not path:
                    raise BundleError(f"bundle entry {member.name!r} is not a valid file path")
                if path in files:
                    raise BundleError(f"bundle entry {path!r} appears more than once")
                if member.size < 0:
                    raise BundleError(f"bundle entry {member.name!r} has a negative size")
                unpacked += member.size
                if unpacked > max_unpacked_bytes:
                    raise BundleError(
                        f"bundle is too large when unpacked (over {max_unpacked_bytes} bytes of files)"
                    )
                extracted = archive.extractfile(member)
                content = extracted.read(member.size) if extracted is not None else b""
                if len(content) != member.size:
                    raise BundleError(f"bundle entry {member.name!r} is truncated")
                files[path] = content
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise BundleError(
            f"bundle is not a readable tar archive (gzip or plain tar expected): {exc}"
        ) from exc
    return files


def _entry_path(name: str) -> str:
    """Normalise an entry name (``./`` prefixes, doubled slashes); refuse escapes.

    Backslashes count as separators too, so a bundle built on Windows cannot smuggle a
    ``..\\`` past a runner on Windows. Returns "" for the archive root itself.
    """
    if "\x00" in name:
        raise BundleError(f"bundle entry {name!r} contains a NUL character")
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        raise BundleError(f"bundle entry {name!r} is an absolute path")
    parts = [part for part in re.split(r"[/\\]", name) if part not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"bundle entry {name!r} escapes the archive root ('..' segment)")
    return "/".join(parts)


def _check_entry_type(member: tarfile.TarInfo) -> None:
    """Allow only regular files and directories: nothing that links or is a device."""
    if member.isdir() or (member.isreg() and not member.issparse()):
        return
    if member.issym():
        kind = f"a symbolic link (to {member.linkname!r})"
    elif member.islnk():
        kind = f"a hard link (to {member.linkname!r})"
    elif member.ischr() or member.isblk():
        kind = "a device"
    elif member.isfifo():
        kind = "a FIFO"
    elif member.issparse():
        kind = "a sparse file"
    else:
        kind = f"an unsupported entry type ({member.type!r})"
    raise BundleError(
        f"bundle entry {member.name!r} is {kind}; only regular files and directories are allowed"
    )


# --- finding and parsing the spec ------------------------------------------------------


def _is_yaml(path: str) -> bool:
    return path.lower().endswith((".yaml", ".yml"))


def _find_spec_file(files: Mapping[str, bytes]) -> tuple[str, str]:
    """Pick the layout and its spec file: root ``config.yaml``, else the single root YAML."""
    if "config.yaml" in files:
        return "directory", "config.yaml"
    root_yaml = sorted(path for path in files if "/" not in path and _is_yaml(path))
    if len(root_yaml) == 1:
        return "single_file", root_yaml[0]
    if root_yaml:
        shown = ", ".join(root_yaml[:5]) + (", ..." if len(root_yaml) > 5 else "")
        raise BundleError(
            f"bundle has {len(root_yaml)} YAML files at the archive root ({shown}) and no "
            "config.yaml; a single-file bundle must hold exactly one"
        )
    nested = sorted(path for path in files if _is_yaml(path))
    hint = f" (found {nested[0]!r}: pack the folder's contents, not the folder)" if nested else ""
    raise BundleError(
        f"no agent YAML found at the archive root: expected config.yaml or one *.yaml file{hint}"
    )


class _BoundedComposer(Composer, SafeConstructor, Resolver):
    """PyYAML's composer and safe constructor (standard tags only, so no object is ever
    built from a tag) with a bound on the work one document may ask for.

    Composing turns parser events into nodes; every node costs one unit, and an alias
    costs as many units as the node it names stands for, so a billion-laughs document
    is refused after ``_MAX_YAML_NODES`` units, before anything is constructed. Nesting
    deeper than ``_MAX_YAML_DEPTH`` collections is refused at the first level too many
    (PyYAML's composer recurses per level). The events come from ``_BoundedLoader``'s
    parser; one loader per document.
    """

    # From the parser half of the loader (libyaml's or PyYAML's).
    check_event: Callable[..., bool]
    peek_event: Callable[[], Any]
    dispose: Callable[[], None]

    def _init_bounds(self) -> None:
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        Composer.__init__(self)
        self._units = 0
        self._depth = 0
        self._units_of: dict[int, int] = {}  # id(node) -> units it stands for, once composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = self.anchors.get(anchor)
            if node is not None:  # an undefined alias is PyYAML's own error, below
                units = self._units_of.get(id(node))
                if units is None:
                    raise BundleError(f"the alias *{anchor} refers to itself{self._where()}")
                self._spend(units)
            return super().compose_node(parent, index)
        if self._depth >= _MAX_YAML_DEPTH + 1:
            raise BundleError(
                f"the YAML is nested deeper than {_MAX_YAML_DEPTH} levels{self._where()}"
            )
        start = self._units
        self._spend(1)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._units_of[id(node)] = self._units - start
        return node

    def _spend(self, units: int) -> None:
        self._units += units
        if self._units > _MAX_YAML_NODES:
            raise BundleError(
                f"the YAML is too large once aliases are expanded (over {_MAX_YAML_NODES} "
                f"values){self._where()}"
            )

    def _where(self) -> str:
        mark = self.peek_event().start_mark
        return f" (line {mark.line + 1})"


class _PythonBoundedLoader(_BoundedComposer, Reader, Scanner, Parser):
    """Events from PyYAML's own Python parser (when PyYAML was built without libyaml)."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        self._init_bounds()


_BoundedLoader: Callable[[str], _BoundedComposer] = _PythonBoundedLoader
if CParser is not None:

    class _LibyamlBoundedLoader(_BoundedComposer, CParser):
        """Events from libyaml (ten times faster than PyYAML's Python scanner on a
        spec of small tokens), composed and constructed in Python with the bounds."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            self._init_bounds()

    _BoundedLoader = _LibyamlBoundedLoader


def _load_yaml(content: bytes, path: str) -> dict[str, Any]:
    """Parse with ``_BoundedLoader`` (no tags, no environment expansion); demand a mapping."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path!r} is not UTF-8 text: {exc}") from exc
    loader = _BoundedLoader(text)
    try:
        raw = loader.get_single_data()
    except BundleError as exc:
        raise BundleError(f"{path!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise BundleError(f"{path!r} is not valid YAML: {_yaml_problem(exc)}") from exc
    except ValueError as exc:  # int() of over 4,300 digits, and the like
        raise BundleError(f"{path!r} is not valid YAML: {_short(str(exc), 120)}") from exc
    except RecursionError as exc:
        raise BundleError(f"{path!r} is nested too deeply") from exc
    finally:
        loader.dispose()
    if not isinstance(raw, dict):
        got = "an empty document" if raw is None else _kind(raw)
        raise BundleError(f"{path!r} must hold a mapping at the top level, not {got}")
    for key in raw:
        if not isinstance(key, str):
            raise BundleError(f"{path!r} has a top-level key that is not a string: {key!r}")
    try:
        _jsonable(raw, secret=None, budget=[_MAX_YAML_NODES])
    except BundleError as exc:
        raise BundleError(f"{path!r}: {exc}") from None
    return raw


def _build_spec(
    raw: dict[str, Any], *, files: Mapping[str, bytes], layout: str, source: str
) -> AgentSpec:
    """Check the implemented fields and apply their defaults."""
    if layout == "directory":
        version = raw.get("spec_version")
        if type(version) is not int or version != 1:
            raise BundleError(f"config.yaml must set spec_version: 1 (got {_short(version)})")
    elif "spec_version" in raw:
        raise BundleError(
            f"{source!r} sets spec_version, which only a root config.yaml may do (directory layout)"
        )

    name = raw.get("name")
    if name is None:
        raise BundleError(f"{source!r} is missing the required 'name'")
    if not isinstance(name, str):
        raise BundleError(f"'name' must be a string, not {_kind(name)}")
    if not NAME_RE.fullmatch(name):
        raise BundleError(
            f"name {_short(name)} is invalid: use 1-128 characters from A-Z, a-z, 0-9, '_', '-'"
        )

    prompt = _opt_str(raw, "prompt", "prompt")
    instructions = _opt_str(raw, "instructions", "instructions")
    if prompt is None and instructions is not None:
        prompt = _instructions_text(instructions, files) if layout == "directory" else instructions
    if prompt is None:
        if layout == "single_file":
            raise BundleError(f"{source!r} has no 'prompt' (or 'instructions')")
        prompt = ""

    executor = _opt_mapping(raw, "executor", "executor") or {}
    api = executor.get("api")
    if api is None:
        api = "responses"
    elif api not in APIS:
        raise BundleError(
            f"executor.api must be 'responses' or 'chat_completions' (got {_short(api)})"
        )
    api_key, base_url = _auth(executor)

    os_env = _os_env(raw)
    try:
        mcp_servers = parse_servers(raw.get("tools"), reserved=frozenset(BUILTIN_TOOL_NAMES))
    except McpDeclarationError as exc:
        raise BundleError(str(exc), field=exc.field) from exc
    unknown = tuple(key for key in raw if key not in KNOWN_KEYS)
    if unknown:
        logger.warning(
            "agent %r: ignoring unsupported top-level keys: %s", name, ", ".join(unknown)
        )

    return AgentSpec(
        name=name,
        description=_opt_str(raw, "description", "description") or "",
        prompt=prompt,
        model=_opt_str(executor, "model", "executor.model"),
        api=api,
        api_key=api_key,
        base_url=base_url,
        max_iterations=_max_iterations(executor.get("max_iterations")),
        timeout=_timeout(executor.get("timeout")),
        os_env=os_env,
        unknown_keys=unknown,
        raw=raw,
        guardrails=_guardrails(
            raw.get("guardrails"), mcp_servers=[server.name for server in mcp_servers]
        ),
        tool_choice=_tool_choice(executor.get("tool_choice"), has_os_env=os_env is not None),
        mcp_servers=mcp_servers,
    )


def _instructions_text(instructions: str, files: Mapping[str, bytes]) -> str:
    """The text of the bundle file ``instructions`` names, or the value itself if none."""
    try:
        path = _entry_path(instructions.strip())
    except BundleError:
        return instructions
    content = files.get(path) if path else None
    if content is None:
        return instructions
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BundleError(f"instructions file {path!r} is not UTF-8 text") from exc
    if "\x00" in text:
        raise BundleError(f"instructions file {path!r} holds a NUL character")
    return text


def _auth(executor: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``executor.auth``: (api_key, base_url). Never echoes the key in a message."""
    auth = _opt_mapping(executor, "auth", "executor.auth")
    if auth is None:
        return None, None
    auth_type = auth.get("type")
    if auth_type != "api_key":
        raise BundleError(
            f"executor.auth.type must be 'api_key' (got {_short(auth_type)}); "
            "it is the only supported type"
        )
    api_key = auth.get("api_key")
    if api_key is not None and not isinstance(api_key, str):
        raise BundleError(f"executor.auth.api_key must be a string, not {_kind(api_key)}")
    if not api_key or not api_key.strip():
        raise BundleError(
            "executor.auth.api_key is missing or empty (required with type 'api_key')"
        )
    return api_key, _opt_str(auth, "base_url", "executor.auth.base_url")


def _tool_choice(value: Any, *, has_os_env: bool) -> str | None:
    """``executor.tool_choice``: a mode, or one tool's name. A built-in name must be one
    of the ``sys_os_*`` tools and needs ``os_env``; a client tool's name can only be
    checked per turn, against the tools the message brings (``turn.py``)."""
    if value is None or value in TOOL_CHOICE_MODES:
        return value
    if not isinstance(value, str) or not TOOL_NAME_RE.fullmatch(value):
        raise BundleError(
            "executor.tool_choice must be 'auto', 'required', 'none' or the name of a tool "
            f"(got {_short(value)})"
        )
    if value.startswith("sys_os_"):
        if value not in BUILTIN_TOOL_NAMES:
            raise BundleError(
                f"executor.tool_choice names {value!r}, which is not a built-in tool "
                f"({', '.join(BUILTIN_TOOL_NAMES)})"
            )
        if not has_os_env:
            raise BundleError(
                f"executor.tool_choice names {value!r}, but the agent has no os_env, "
                "so it has no sys_os_* tools"
            )
    return value


def _max_iterations(value: Any) -> int:
    if value is None:
        return DEFAULT_MAX_ITERATIONS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BundleError(
            f"executor.max_iterations must be a positive integer (got {_short(value)})"
        )
    return min(value, MAX_ITERATIONS_CAP)


def _timeout(value: Any) -> float:
    if value is None:
        return DEFAULT_TIMEOUT
    seconds = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            pass
    if not (math.isfinite(seconds) and seconds > 0):
        raise BundleError(
            f"executor.timeout must be a positive number of seconds (got {_short(value)})"
        )
    return seconds


def _guardrails(value: Any, *, mcp_servers: list[str]) -> Guardrails:
    """The ``guardrails`` block; its problems become one message naming each field path."""
    try:
        return parse_guardrails(value, mcp_servers=mcp_servers)
    except RuleError as exc:
        listed = list(exc.fields.items())
        problems = "; ".join(f"{path}: {problem}" for path, problem in listed[:10])
        more = f" (and {len(listed) - 10} more)" if len(listed) > 10 else ""
        raise BundleError(f"invalid guardrails: {problems}{more}") from exc


def _os_env(raw: Mapping[str, Any]) -> OsEnv | None:
    section = _opt_mapping(raw, "os_env", "os_env")
    if section is None:
        return None
    env_type = section.get("type")
    if env_type is None:
        env_type = "caller_process"
    elif env_type != "caller_process":
        raise BundleError(
            f"os_env.type must be 'caller_process' (got {_short(env_type)}); it is the only type"
        )
    cwd = _opt_str(section, "cwd", "os_env.cwd") or "."
    if "\x00" in cwd:
        raise BundleError("os_env.cwd contains a NUL character")
    if cwd.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", cwd):
        raise BundleError(
            f"os_env.cwd must be relative to the runner workspace (got {_short(cwd)})"
        )
    if ".." in re.split(r"[/\\]", cwd):
        raise BundleError(f"os_env.cwd must not contain a '..' segment (got {_short(cwd)})")
    sandbox = _opt_mapping(section, "sandbox", "os_env.sandbox") or {}
    sandbox_type = sandbox.get("type")
    if sandbox_type is None:
        sandbox_type = "none"
    elif sandbox_type != "none":
        raise BundleError(
            f"os_env.sandbox.type {_short(sandbox_type)} is not supported; only 'none' is implemented"
        )
    return OsEnv(type=env_type, cwd=cwd, sandbox_type=sandbox_type)


# --- small helpers ---------------------------------------------------------------------


def _opt_str(mapping: Mapping[str, Any], key: str, where: str) -> str | None:
    value = mapping.get(key)
    if value is not None and not isinstance(value, str):
        raise BundleError(f"{where} must be a string, not {_kind(value)}")
    return value


def _opt_mapping(mapping: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = mapping.get(key)
    if value is not None and not isinstance(value, dict):
        raise BundleError(f"{where} must be a mapping, not {_kind(value)}")
    return value


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's problem and position on one line, without its multi-line source excerpt."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _kind(value: Any) -> str:
    """A YAML-ish name for a value's type, for messages."""
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    return names.get(type(value), f"a value of type {type(value).__name__}")


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to a readable length, so a huge value cannot flood a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(value: Any, *, secret: str | None, budget: list[int], depth: int = 0) -> Any:
    """A JSON-safe copy with secret-named keys masked and ``secret`` scrubbed from strings.

    Also the guard against alias bombs and self-referencing YAML: it gives up once
    ``budget`` values have been visited or nesting passes a sane depth.
    """
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_YAML_DEPTH:
        raise BundleError("the YAML is too large or nested too deeply once aliases are expanded")

    def scrub(text: str) -> str:
        if _UNSTORABLE_RE.search(text):
            raise BundleError("the YAML holds a NUL character or a lone surrogate")
        return text.replace(secret, MASK) if secret else text

    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            name = scrub(key if isinstance(key, str) else str(key))
            masked = item is not None and not isinstance(item, Mapping | list | tuple)
            if masked and _SECRET_KEY_RE.search(name):
                result[name] = MASK
            else:
                result[name] = _jsonable(item, secret=secret, budget=budget, depth=depth + 1)
        return result
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item, secret=secret, budget=budget, depth=depth + 1) for item in value]
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return scrub(value if isinstance(value, str) else str(value))
