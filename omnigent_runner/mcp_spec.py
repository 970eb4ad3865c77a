"""MCP server declarations in a bundle (``tools:`` entries with ``type: mcp``; mcp.md).

The server checks them at upload and the runner reads them back with this same code,
as for the rest of the bundle (:mod:`omnigent_runner.bundles`). Only mapping values of
``tools:`` whose ``type`` is ``mcp`` are declarations; every other key is kept and
ignored. Values are taken literally: ``${NAME}`` is expanded by the runner only, and only
for names its operator allows (:func:`expand`). Header and env values are secrets as far
as anything shown is concerned: :meth:`McpServerSpec.public_dict` leaves them out and
:func:`redact_raw` masks them in the stored copy of the YAML.

Django-free, because the runner imports it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SERVER_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SERVERS = 16
DEFAULT_CALL_TIMEOUT = 120.0
MAX_CALL_TIMEOUT = 3600.0
KNOWN_KEYS = frozenset(
    {
        "type",
        "command",
        "args",
        "env",
        "url",
        "headers",
        "tools",
        "timeout",
        "description",
        "shared",
    }
)
REDACTED = "[REDACTED]"
# OpenAI's function-name limit; longer namespaced names are cut (:func:`tool_name`).
MAX_TOOL_NAME = 64
_EXPAND_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpDeclarationError(ValueError):
    """A declaration that does not validate; ``field`` is its path (``tools.git.args``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message


@dataclass(frozen=True)
class McpServerSpec:
    """One checked declaration. ``env`` and ``headers`` are secrets: never shown."""

    name: str
    transport: str  # "stdio" | "http" | "sse"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    url: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    tools: tuple[str, ...] | None = None  # the allow-list; None: every tool the server lists
    timeout: float = DEFAULT_CALL_TIMEOUT
    description: str = ""
    shared: bool = False

    def public_dict(self) -> dict[str, Any]:
        """What an endpoint may show: no header or env values, no URL credentials."""
        return {
            "name": self.name,
            "transport": self.transport,
            "description": self.description,
            "url": public_url(self.url) if self.url is not None else None,
            "command": self.command,
            "args": list(self.args),
            "allowed_tools": None if self.tools is None else list(self.tools),
            "timeout": self.timeout,
            "shared": self.shared,
        }

    def identity(self) -> str:
        """A digest of the whole declaration (for sharing a process between sessions)."""
        material = repr(
            (
                self.transport,
                self.command,
                self.args,
                sorted(self.env.items()),
                self.url,
                sorted(self.headers.items()),
            )
        )
        return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()


def parse_servers(
    tools: Any, *, reserved: frozenset[str] | set[str] = frozenset()
) -> tuple[McpServerSpec, ...]:
    """The MCP declarations of a spec's ``tools`` value, in declaration order.

    ``reserved`` holds built-in tool names a server name must not take. A ``tools`` value
    that is not a mapping, and entries that are not ``type: mcp`` mappings, are ignored.
    """
    if not isinstance(tools, dict):
        return ()
    servers: list[McpServerSpec] = []
    seen: dict[str, str] = {}
    for name, entry in tools.items():
        if not isinstance(entry, dict) or entry.get("type") != "mcp":
            continue
        where = f"tools.{name}"
        if not isinstance(name, str) or not SERVER_NAME_RE.fullmatch(name):
            raise McpDeclarationError(
                where, "an MCP server name must be 1-64 characters from A-Z, a-z, 0-9, '_', '-'"
            )
        if name in reserved:
            raise McpDeclarationError(where, f"the name {name!r} is a built-in tool's")
        if name.lower() in seen:
            raise McpDeclarationError(
                where, f"the name clashes with the MCP server {seen[name.lower()]!r}"
            )
        seen[name.lower()] = name
        servers.append(_parse_server(name, entry, where))
        if len(servers) > MAX_SERVERS:
            raise McpDeclarationError("tools", f"at most {MAX_SERVERS} MCP servers may be declared")
    return tuple(servers)


def _parse_server(name: str, entry: Mapping[str, Any], where: str) -> McpServerSpec:
    command = entry.get("command")
    url = entry.get("url")
    if (command is None) == (url is None):
        raise McpDeclarationError(
            where, "declare exactly one of 'command' (stdio) or 'url' (Streamable HTTP or SSE)"
        )
    description = _opt_text(entry, "description", where) or ""
    allow = _string_list(entry.get("tools"), f"{where}.tools")
    timeout = _call_timeout(entry.get("timeout"), f"{where}.timeout")
    shared = entry.get("shared", False)
    if not isinstance(shared, bool):
        raise McpDeclarationError(f"{where}.shared", "must be true or false")
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise McpDeclarationError(f"{where}.command", "must be a non-empty string")
        _no_nul(command, f"{where}.command")
        if "headers" in entry and entry["headers"] is not None:
            raise McpDeclarationError(f"{where}.headers", "only an HTTP server (url) takes headers")
        args = _string_list(entry.get("args"), f"{where}.args") or ()
        env = _string_map(entry.get("env"), f"{where}.env")
        return McpServerSpec(
            name=name,
            transport="stdio",
            command=command,
            args=tuple(args),
            env=env,
            tools=allow,
            timeout=timeout,
            description=description,
            shared=shared,
        )
    if not isinstance(url, str):
        raise McpDeclarationError(f"{where}.url", "must be a string")
    _no_nul(url, f"{where}.url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") and not url.startswith("${"):
        raise McpDeclarationError(f"{where}.url", "must be an http:// or https:// URL")
    for key in ("args", "env"):
        if entry.get(key) is not None:
            raise McpDeclarationError(f"{where}.{key}", "only a stdio server (command) takes it")
    headers = _string_map(entry.get("headers"), f"{where}.headers")
    transport = "sse" if parts.path.rstrip("/").endswith("/sse") else "http"
    return McpServerSpec(
        name=name,
        transport=transport,
        url=url,
        headers=headers,
        tools=allow,
        timeout=timeout,
        description=description,
        shared=shared,
    )


def redact_raw(tools: Any) -> Any:
    """A copy of the YAML's ``tools`` value with MCP header and env values masked and URL
    credentials removed, for the stored and shown copy of the spec."""
    if not isinstance(tools, dict):
        return tools
    result: dict[Any, Any] = {}
    for name, entry in tools.items():
        if isinstance(entry, dict) and entry.get("type") == "mcp":
            entry = dict(entry)
            for key in ("env", "headers"):
                if isinstance(entry.get(key), dict):
                    entry[key] = {k: REDACTED for k in entry[key]}
            if isinstance(entry.get("url"), str):
                entry["url"] = public_url(entry["url"])
        result[name] = entry
    return result


def public_url(url: str) -> str:
    """``url`` without user:password and without its query string (tokens live there)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc.rpartition("@")[2]
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


# --- the runner's side ------------------------------------------------------------------


class ExpansionError(ValueError):
    """A ``${NAME}`` the runner's operator does not allow, or that is not set."""


def expand(value: str, *, allowed: frozenset[str] | set[str], env: Mapping[str, str]) -> str:
    """``${NAME}`` replaced from ``env`` for names in ``allowed``; any other is an error
    (never a silent empty string). The message names the variable, never its value."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in allowed:
            raise ExpansionError(
                f"${{{name}}} is not allowed on this runner (OMNIGENT_RUNNER_MCP_ENV)"
            )
        if name not in env:
            raise ExpansionError(f"${{{name}}} is not set on this runner")
        return env[name]

    return _EXPAND_RE.sub(replace, value)


def tool_name(server: str, tool: str) -> str:
    """``<server>__<tool>``; past 64 characters cut to 55 + ``_`` + 8 hex of its hash."""
    name = f"{server}__{tool}"
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{name[:55]}_{digest}"


# --- small checks -----------------------------------------------------------------------


def _opt_text(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise McpDeclarationError(f"{where}.{key}", "must be a string")
    return value


def _string_list(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise McpDeclarationError(where, "must be a list of strings")
    for item in value:
        _no_nul(item, where)
    return tuple(value)


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(key, str) and isinstance(item, str) for key, item in value.items()
    ):
        raise McpDeclarationError(where, "must be a mapping of string keys to string values")
    for key, item in value.items():
        _no_nul(key, where)
        _no_nul(item, where)
    return dict(value)


def _call_timeout(value: Any, where: str) -> float:
    if value is None:
        return DEFAULT_CALL_TIMEOUT
    seconds = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            pass
    if not (math.isfinite(seconds) and 1 <= seconds <= MAX_CALL_TIMEOUT):
        raise McpDeclarationError(
            where, f"must be a number of seconds from 1 to {int(MAX_CALL_TIMEOUT)}"
        )
    return seconds


def _no_nul(value: str, where: str) -> None:
    if "\x00" in value:
        raise McpDeclarationError(where, "must not contain a NUL character")
