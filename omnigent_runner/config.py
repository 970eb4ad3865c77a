"""The runner program's configuration: environment variables, overridden by flags.

The variable names are Omnigent's launch recipe (tunnel.md, Identity), so a runner can be
started by the same supervisor either way. Everything is validated here, before any
network activity, so a misconfigured runner fails at once with a message that says what
to fix. The binding token is a secret: it never appears in an error message or a repr.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

from omnigent_runner.coalesce import DEFAULT_DELTA_INTERVAL_MS, MAX_DELTA_INTERVAL_MS
from omnigent_runner.identity import derive_runner_id
from omnigent_runner.logs import LOG_FORMATS, log_format_from

DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
# The program's names in ``--help``: the wheel's console script, or the module.
CONSOLE_SCRIPT = "omnigent-runner"
MODULE_COMMAND = "python -m omnigent_runner"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
_WS_SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}

ENV_SERVER_URL = "RUNNER_SERVER_URL"
ENV_TOKEN = "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN"
# A file holding the token (a systemd credential, deploy/omnigent-runner.service).
ENV_TOKEN_FILE = "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN_FILE"
ENV_RUNNER_ID = "OMNIGENT_RUNNER_ID"
ENV_WORKSPACE = "OMNIGENT_RUNNER_WORKSPACE"
ENV_PARENT_PID = "OMNIGENT_RUNNER_PARENT_PID"
ENV_ISOLATE = "OMNIGENT_RUNNER_ISOLATE_SESSION"
ENV_LOG_LEVEL = "OMNIGENT_RUNNER_LOG_LEVEL"
ENV_LOG_FORMAT = "OMNIGENT_RUNNER_LOG_FORMAT"
ENV_DELTA_INTERVAL = "OMNIGENT_RUNNER_DELTA_INTERVAL_MS"
ENV_LLM_HTTP_CLIENT = "OMNIGENT_RUNNER_LLM_HTTP_CLIENT"
ENV_MAX_TURNS = "OMNIGENT_RUNNER_MAX_TURNS"
# How many turns the runner runs at once, declared in ``hello``: the server starts no
# more on it (usage.md, Fair share of runners).
DEFAULT_MAX_TURNS = 8
MAX_MAX_TURNS = 1000

# The openai SDK's HTTP transport (``llm.ClientPool``): aiohttp (the SDK's
# ``DefaultAioHttpClient``, less CPU per streamed token) or httpx (the SDK's default).
LLM_HTTP_CLIENTS = ("aiohttp", "httpx")
DEFAULT_LLM_HTTP_CLIENT = "aiohttp"


class ConfigError(Exception):
    """The configuration is unusable; the message is safe to print (no token)."""


@dataclass(frozen=True)
class RunnerConfig:
    """Validated settings for one runner process."""

    server_url: str
    token: str = field(repr=False)
    runner_id: str
    workspace: Path
    parent_pid: int | None = None
    isolate_session: bool = False
    log_level: str = "INFO"
    # ``text`` or ``json`` (omnigent_runner/logs.py).
    log_format: str = "text"
    # Streamed text of an item goes out as at most one delta event per this many ms.
    delta_interval_ms: int = DEFAULT_DELTA_INTERVAL_MS
    # The openai SDK's HTTP transport: one of LLM_HTTP_CLIENTS.
    llm_http_client: str = DEFAULT_LLM_HTTP_CLIENT
    # Turns run at once, declared in ``hello`` (the server holds the rest ``queued``).
    max_turns: int = DEFAULT_MAX_TURNS

    @property
    def tunnel_url(self) -> str:
        """``ws(s)://host[:port]/<base path>/v1/runners/{runner_id}/tunnel``.

        The base path is kept so a server mounted under a prefix behind a proxy works.
        """
        parts = urlsplit(self.server_url)
        path = parts.path.rstrip("/") + f"/v1/runners/{self.runner_id}/tunnel"
        return urlunsplit((_WS_SCHEMES[parts.scheme], parts.netloc, path, "", ""))


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`ConfigError` instead of exiting.

    ``main`` turns every configuration problem into the same exit code and message
    format, whether it came from a flag or from the environment.
    """

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Dial the server's runner tunnel and run agent sessions in a workspace.",
    )
    parser.add_argument("--server-url", help=f"server base URL (env {ENV_SERVER_URL})")
    parser.add_argument("--token", help=f"tunnel binding token (env {ENV_TOKEN})")
    parser.add_argument(
        "--token-file",
        help=f"read the binding token from this file when none is given (env {ENV_TOKEN_FILE})",
    )
    parser.add_argument("--runner-id", help=f"expected runner id (env {ENV_RUNNER_ID})")
    parser.add_argument("--workspace", help=f"workspace root (env {ENV_WORKSPACE})")
    parser.add_argument("--parent-pid", help=f"exit when this process exits (env {ENV_PARENT_PID})")
    parser.add_argument(
        "--isolate-session",
        action="store_true",
        default=None,
        help=f"give each session its own subfolder of the workspace (env {ENV_ISOLATE}=1)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=_LOG_LEVELS,
        help=f"logging level (env {ENV_LOG_LEVEL}, default INFO)",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=LOG_FORMATS,
        help=f"log lines as text or one JSON object each (env {ENV_LOG_FORMAT} or "
        "OMNIGENT_LOG_FORMAT, default text)",
    )
    parser.add_argument(
        "--delta-interval-ms",
        help=(
            "send an item's streamed text at most once per this many milliseconds, "
            f"0 to send every token (env {ENV_DELTA_INTERVAL}, "
            f"default {DEFAULT_DELTA_INTERVAL_MS})"
        ),
    )
    parser.add_argument(
        "--llm-http-client",
        type=str.lower,
        choices=LLM_HTTP_CLIENTS,
        help=(
            "the openai SDK's HTTP transport for model calls "
            f"(env {ENV_LLM_HTTP_CLIENT}, default {DEFAULT_LLM_HTTP_CLIENT})"
        ),
    )
    parser.add_argument(
        "--max-turns",
        help=(
            "how many turns this runner runs at once; the server queues the rest "
            f"(env {ENV_MAX_TURNS}, default {DEFAULT_MAX_TURNS})"
        ),
    )
    return parser


def _pick(flag: str | None, env: Mapping[str, str], name: str) -> str | None:
    """The flag if given, else the environment variable; empty strings count as unset."""
    if flag is not None and flag.strip():
        return flag.strip()
    value = env.get(name, "")
    return value.strip() or None


def _validate_server_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in _WS_SCHEMES or not parts.netloc:
        raise ConfigError(
            f"{ENV_SERVER_URL} must be an http(s) URL such as {DEFAULT_SERVER_URL}, got {url!r}"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{ENV_SERVER_URL} must not have a query or fragment, got {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _read_token_file(raw: str | None) -> str | None:
    """The token in the file ``raw`` names (surrounding whitespace dropped), if any."""
    if raw is None:
        return None
    try:
        return Path(raw).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{ENV_TOKEN_FILE}: cannot read {raw!r}: {exc.__class__.__name__}"
        ) from None


def _validate_token(token: str | None) -> str:
    if not token:
        raise ConfigError(
            f"a tunnel binding token is required: set {ENV_TOKEN} or {ENV_TOKEN_FILE}, "
            "or pass --token or --token-file"
        )
    if not token.isprintable() or any(ch.isspace() for ch in token):
        # It travels in an HTTP header, so it cannot hold whitespace or control characters.
        raise ConfigError(f"{ENV_TOKEN} contains whitespace or control characters")
    return token


def _parse_parent_pid(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        pid = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PARENT_PID} must be a process id, got {raw!r}") from None
    if pid <= 0:
        raise ConfigError(f"{ENV_PARENT_PID} must be a positive process id, got {pid}")
    return pid


def _parse_delta_interval(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_DELTA_INTERVAL_MS
    problem = (
        f"{ENV_DELTA_INTERVAL} must be a whole number of milliseconds from 0 (off) "
        f"to {MAX_DELTA_INTERVAL_MS}, got {raw!r}"
    )
    # Plain ASCII digits only: int() would also take "1_000", "+5" or non-Latin digits.
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_DELTA_INTERVAL_MS:
        raise ConfigError(problem)
    return int(raw)


def _parse_max_turns(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_MAX_TURNS
    # Plain ASCII digits only, as for the delta interval.
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_MAX_TURNS:
        raise ConfigError(
            f"{ENV_MAX_TURNS} must be a whole number from 1 to {MAX_MAX_TURNS}, got {raw!r}"
        )
    return int(raw)


def _parse_llm_http_client(raw: str | None) -> str:
    client = (raw or DEFAULT_LLM_HTTP_CLIENT).lower()
    if client not in LLM_HTTP_CLIENTS:
        raise ConfigError(
            f"{ENV_LLM_HTTP_CLIENT} must be one of {', '.join(LLM_HTTP_CLIENTS)}, got {raw!r}"
        )
    if client == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
        # A runner installed without the openai SDK's aiohttp extra: say so now, not
        # as a failed turn.
        raise ConfigError(
            "the aiohttp HTTP client is not installed: install the runner's requirements "
            f"(openai[aiohttp]) or set {ENV_LLM_HTTP_CLIENT}=httpx"
        )
    return client


def program_name(argv0: str) -> str:
    """The command the runner was started as, for its usage line: the console script
    (``omnigent-runner``, ``omnigent-runner.exe``) by its name, anything else (``-m``
    runs the module as ``…/__main__.py``) as ``python -m omnigent_runner``."""
    # PureWindowsPath splits on both "/" and "\\".
    return CONSOLE_SCRIPT if PureWindowsPath(argv0).stem == CONSOLE_SCRIPT else MODULE_COMMAND


def load_config(
    argv: list[str] | None, env: Mapping[str, str], *, prog: str = MODULE_COMMAND
) -> RunnerConfig:
    """Build the configuration from ``argv`` (flags win) and ``env``; ``prog`` names the
    program in ``--help``.

    Raises :class:`ConfigError` for anything unusable, so the runner never dials the
    server with settings that can only fail there.
    """
    args = _build_parser(prog).parse_args(argv)

    server_url = _validate_server_url(
        _pick(args.server_url, env, ENV_SERVER_URL) or DEFAULT_SERVER_URL
    )
    token = _validate_token(
        _pick(args.token, env, ENV_TOKEN)
        or _read_token_file(_pick(args.token_file, env, ENV_TOKEN_FILE))
    )
    runner_id = derive_runner_id(token)
    expected_id = _pick(args.runner_id, env, ENV_RUNNER_ID)
    if expected_id is not None and expected_id != runner_id:
        raise ConfigError(
            f"{ENV_RUNNER_ID} {expected_id!r} does not match the id derived from the "
            f"binding token ({runner_id!r}); check that the token belongs to this runner"
        )

    workspace_raw = _pick(args.workspace, env, ENV_WORKSPACE)
    workspace = Path(workspace_raw).expanduser() if workspace_raw else Path.cwd()
    workspace = workspace.resolve()
    if not workspace.is_dir():
        raise ConfigError(f"workspace {str(workspace)!r} is not a directory")

    if args.isolate_session is not None:
        isolate = bool(args.isolate_session)
    else:
        isolate = env.get(ENV_ISOLATE, "").strip().lower() in _TRUE_VALUES

    log_level = args.log_level or env.get(ENV_LOG_LEVEL, "").strip().upper() or "INFO"
    if log_level not in _LOG_LEVELS or not isinstance(logging.getLevelName(log_level), int):
        raise ConfigError(f"{ENV_LOG_LEVEL} must be one of {', '.join(_LOG_LEVELS)}")

    log_format = args.log_format or log_format_from(env)
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"{ENV_LOG_FORMAT} must be one of {', '.join(LOG_FORMATS)}")

    return RunnerConfig(
        server_url=server_url,
        token=token,
        runner_id=runner_id,
        workspace=workspace,
        parent_pid=_parse_parent_pid(_pick(args.parent_pid, env, ENV_PARENT_PID)),
        isolate_session=isolate,
        log_level=log_level,
        log_format=log_format,
        delta_interval_ms=_parse_delta_interval(
            _pick(args.delta_interval_ms, env, ENV_DELTA_INTERVAL)
        ),
        llm_http_client=_parse_llm_http_client(
            _pick(args.llm_http_client, env, ENV_LLM_HTTP_CLIENT)
        ),
        max_turns=_parse_max_turns(_pick(args.max_turns, env, ENV_MAX_TURNS)),
    )
