"""The runner's MCP client (mcp.md, "Lifecycle on the runner" and "Tools as the model
sees them"): a session's MCP servers, started when it opens and stopped when it closes.

The client is the official ``mcp`` SDK (:class:`mcp.Client` over ``stdio_client``,
``streamable_http_client`` or ``sse_client``); it negotiates the protocol version and
drives both ways a server asks a question (``elicitation/create`` mid-call on older
versions, ``input_required`` results on the current one) through one callback, which
this module hands to the turn's approval gate. The SDK is imported only when a session
declares a server: importing it costs more than a second of CPU.

Each connection lives in a task of its own (the SDK's context managers must be entered
and left in one task); calls are made from the turn's task. A stdio server runs in its
own process group with the workspace as its working directory and a minimal
environment (the SDK's safe variables, the locale, and the declared ``env``), and on
Linux under a parent-death signal, so a runner killed with ``SIGKILL`` leaves no server
behind; its stdin closing is the second guard. Leaving the connection stops the whole
process group (the SDK's shutdown: stdin closed, then ``SIGTERM``, then ``SIGKILL``).

Django-free.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import ipaddress
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from omnigent_runner.mcp_spec import REDACTED, ExpansionError, McpServerSpec, expand, tool_name

logger = logging.getLogger(__name__)

ENV_ALLOWED_NAMES = "OMNIGENT_RUNNER_MCP_ENV"
ENV_ALLOW_STDIO = "OMNIGENT_RUNNER_MCP_STDIO"
ENV_ALLOW_PRIVATE_URLS = "OMNIGENT_RUNNER_MCP_PRIVATE_URLS"
ENV_MAX_STARTS = "OMNIGENT_RUNNER_MCP_MAX_STARTS"
ENV_START_TIMEOUT = "OMNIGENT_RUNNER_MCP_START_TIMEOUT_S"

START_TIMEOUT_S = 20.0  # initialize + tools/list, per server (mcp.md)
DEFAULT_MAX_STARTS = 8  # servers starting at once on one runner
MAX_OUTPUT_BYTES = 256 * 1024
_MAX_TOOLS_PAGES = 50
_STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown is bounded at about 6 s
_STDERR_TAIL = 600
# Variables a stdio server gets besides the SDK's defaults (HOME, LOGNAME, PATH, SHELL,
# TERM, USER) and its declared env: the locale and where temporary files go.
_EXTRA_SAFE_VARS = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ")
_FALSE_VALUES = frozenset({"0", "false", "no", "off"})

Status: TypeAlias = Literal["starting", "ready", "failed", "stopped"]
ElicitAction: TypeAlias = Literal["accept", "decline", "cancel"]
# The turn's answer to a server's question: (action, content) for (message, schema).
ElicitHandler: TypeAlias = Callable[
    [str, dict[str, Any]], Awaitable[tuple[ElicitAction, dict[str, Any] | None]]
]

# Run by the runner's own Python before the server's command (Linux): the server gets
# SIGKILL when the runner dies, however it dies; then it becomes the command (exec).
_PDEATHSIG_LAUNCHER = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGKILL)\n"
    "if os.getppid()!=int(sys.argv[1]):os._exit(1)\n"
    "try:os.execvp(sys.argv[2],sys.argv[2:])\n"
    "except OSError as e:sys.stderr.write(f'cannot run {sys.argv[2]!r}: {e}\\n');os._exit(127)\n"
)


@dataclass(frozen=True)
class McpSettings:
    """What the runner's operator allows (environment variables, docs/configuration.md)."""

    allowed_env: frozenset[str] = frozenset()
    allow_stdio: bool = True
    allow_private_urls: bool = True
    start_timeout_s: float = START_TIMEOUT_S
    max_starts: int = DEFAULT_MAX_STARTS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> McpSettings:
        names = frozenset(
            name.strip() for name in env.get(ENV_ALLOWED_NAMES, "").split(",") if name.strip()
        )
        try:
            max_starts = max(1, int(env.get(ENV_MAX_STARTS, "") or DEFAULT_MAX_STARTS))
        except ValueError:
            max_starts = DEFAULT_MAX_STARTS
        try:
            start_timeout = float(env.get(ENV_START_TIMEOUT, "") or START_TIMEOUT_S)
        except ValueError:
            start_timeout = START_TIMEOUT_S
        if not 0 < start_timeout <= 300:
            start_timeout = START_TIMEOUT_S
        return cls(
            allowed_env=names,
            allow_stdio=env.get(ENV_ALLOW_STDIO, "1").strip().lower() not in _FALSE_VALUES,
            allow_private_urls=env.get(ENV_ALLOW_PRIVATE_URLS, "1").strip().lower()
            not in _FALSE_VALUES,
            max_starts=max_starts,
            start_timeout_s=start_timeout,
        )


@dataclass(frozen=True)
class McpTool:
    """A server's tool as the model is offered it."""

    name: str  # namespaced: <server>__<tool>
    server: str
    remote: str  # the server's own name for it
    description: str
    input_schema: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The OpenAI function definition (the format of ``sys_os.tool_definitions``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema or {"type": "object", "properties": {}},
            },
        }


class StartError(Exception):
    """A server that cannot be started; the message is safe to show (no secret)."""


@dataclass(eq=False)
class _Call:
    """One call in flight on a server: its task, deadline and question handler."""

    task: asyncio.Task[Any]
    deadline: float  # loop time; inf while a person answers the server's question
    elicit: ElicitHandler | None
    cancelling: int  # the task's cancel requests when the call began
    expired: bool = False


# The call the current task is making (the current protocol's questions are asked in it).
_CURRENT_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "omnigent_mcp_call", default=None
)


class CallClock:
    """The deadlines of one server's calls in flight, kept by a single loop timer.

    Beginning and ending a call costs two dict operations: the timer is armed only when
    none is, and is neither moved nor cancelled when a call ends early. When it fires it
    cancels the calls whose deadline passed (:meth:`timed_out` tells their
    ``CancelledError`` apart from any other) and re-arms itself at the earliest deadline
    left; with no call left it goes quiet until the next call. So a server called in a
    row costs one wake-up per ``timeout`` at most, not a timer per call. Deadlines of one
    server only grow (one ``timeout`` per server), so a new call never needs the timer
    moved earlier; a call whose question a person is answering has no deadline, and gets
    the timer armed again when it resumes if none is.
    """

    def __init__(self) -> None:
        self._calls: dict[_Call, None] = {}  # in beginning order
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def begin(self, timeout: float, elicit: ElicitHandler | None) -> _Call:
        task = asyncio.current_task()
        assert task is not None
        record = _Call(
            task=task,
            deadline=task.get_loop().time() + timeout,
            elicit=elicit,
            cancelling=task.cancelling(),
        )
        self._calls[record] = None
        self._arm(record.deadline)
        return record

    def end(self, record: _Call) -> None:
        self._calls.pop(record, None)

    def close(self) -> None:
        """Drop the timer (the server stopped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def timed_out(self, record: _Call) -> bool:
        """Whether ``record``'s ``CancelledError`` is its deadline's (and only that)."""
        return record.expired and record.task.uncancel() <= record.cancelling

    def holds(self, record: _Call) -> bool:
        """Whether ``record`` is in flight on this server."""
        return record in self._calls

    def only(self) -> _Call | None:
        """The one call in flight, if exactly one is."""
        return next(iter(self._calls)) if len(self._calls) == 1 else None

    @contextlib.contextmanager
    def paused(self, record: _Call) -> Iterator[None]:
        """Stop ``record``'s clock (a person is answering); it resumes with the time
        left it had."""
        loop = record.task.get_loop()
        began, deadline = loop.time(), record.deadline
        record.deadline = math.inf
        try:
            yield
        finally:
            record.deadline = deadline + (loop.time() - began)
            if record in self._calls:
                self._arm(record.deadline)

    def _arm(self, when: float) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._calls:
            return
        now = asyncio.get_running_loop().time()
        for record in list(self._calls):
            if record.deadline <= now and not record.expired:
                record.expired = True
                record.task.cancel()
        earliest = min((r.deadline for r in self._calls if not r.expired), default=math.inf)
        if earliest != math.inf:
            self._arm(earliest)


class _WatchedReadStream:
    """A transport's read stream that calls ``on_end`` when it ends (the server's output
    closed), so a server that exits while idle is seen at once."""

    def __init__(self, stream: Any, on_end: Callable[[], None]) -> None:
        self._stream = stream
        self._on_end = on_end

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._stream.receive()
        except anyio.EndOfStream:
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:  # ``last_context`` and the like
        return getattr(self._stream, name)


@dataclass
class McpServer:
    """One declared server of one session: its connection, state and tools."""

    spec: McpServerSpec
    cwd: Path
    settings: McpSettings
    env: Mapping[str, str] = field(repr=False)
    on_change: Callable[[], None] = lambda: None
    status: Status = "stopped"
    error: str | None = None
    tools: list[McpTool] = field(default_factory=list)
    _starting: asyncio.Task[None] | None = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _stop: asyncio.Event | None = field(default=None, repr=False)
    _calls: CallClock = field(default_factory=lambda: CallClock(), repr=False)
    _errlog: IO[str] | None = field(default=None, repr=False)
    _expanded: set[str] = field(default_factory=set, repr=False)  # values ${NAME} became

    @property
    def name(self) -> str:
        return self.spec.name

    def state(self) -> dict[str, Any]:
        """This server's entry in ``session.mcp_status``."""
        entry: dict[str, Any] = {
            "status": self.status,
            "transport": self.spec.transport,
            "tools": [tool.name for tool in self.tools] if self.status == "ready" else [],
        }
        if self.error:
            entry["error"] = self.error
        return entry

    # --- starting and stopping ----------------------------------------------------------

    async def ensure_started(self) -> None:
        """Start unless ready, or join the start in progress (a shared server's other
        sessions may be starting it); returns when that start is over."""
        if self.status == "ready":
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.create_task(self.start(), name=f"mcp-start-{self.name}")
        await asyncio.shield(self._starting)

    async def shutdown(self) -> None:
        """Stop for good: a start in progress is cancelled first (else it could launch
        the server after the stop), then the connection is left."""
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.wait([starting], timeout=_STOP_TIMEOUT_S)
        await self.stop()

    async def start(self) -> None:
        """Connect (and for stdio, launch), then list the tools; never raises. Bounded
        by ``settings.start_timeout_s``; a failure leaves ``status`` ``failed``."""
        await self.stop(report=False)
        self._set("starting", None)
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[list[McpTool]] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(ready, self._stop), name=f"mcp-{self.name}")
        # Read the outcome even when nobody waits for it any more (start timed out).
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            async with asyncio.timeout(self.settings.start_timeout_s):
                tools = await asyncio.shield(ready)
        except TimeoutError:
            await self.stop(report=False)
            self._set(
                "failed",
                f"did not start within {self.settings.start_timeout_s:g} s "
                "(initialize and tools/list)",
            )
            return
        except StartError as exc:
            await self.stop(report=False)
            self._set("failed", str(exc))
            return
        except asyncio.CancelledError:
            await asyncio.shield(self.stop(report=False))
            raise
        self.tools = tools
        self._set("ready", None)

    async def stop(self, *, report: bool = True) -> None:
        """Leave the connection (stopping a stdio server's process group)."""
        task, stop = self._task, self._stop
        connected = self._client is not None
        self._task = None
        self._client = None
        if stop is not None:
            stop.set()
        if task is not None and not task.done():
            # A connected client leaves on ``stop``; one still starting (a server that
            # hangs in initialize) is cancelled at once. Either way the SDK's shielded
            # shutdown stops the process group.
            done: set[Any] = set()
            if connected:
                done, _ = await asyncio.wait([task], timeout=_STOP_TIMEOUT_S)
            if not done:
                task.cancel()
                await asyncio.wait([task], timeout=_STOP_TIMEOUT_S)
        self._close_errlog()
        self._calls.close()
        if report and self.status != "stopped":
            self.tools = []
            self._set("stopped", None)

    async def _hold(self, ready: asyncio.Future[list[McpTool]], stop: asyncio.Event) -> None:
        """The connection's task: enter the SDK client, list the tools, hold it until
        ``stop``. Every failure is handed to ``ready`` as a :class:`StartError`."""
        try:
            from mcp import Client
            from mcp_types import Implementation

            client = Client(
                self._transport(),  # a Transport: the client enters and leaves it
                elicitation_callback=self._on_elicit,
                client_info=Implementation(name="omnigent-runner", version="1"),
                cache=None,
            )
            async with client:
                tools = await self._list_tools(client)
                self._client = client
                if not ready.done():
                    ready.set_result(tools)
                await stop.wait()
        except asyncio.CancelledError:
            ready.cancel()
            raise
        except BaseException as exc:  # the SDK raises exception groups from task groups
            message = self._describe(exc)
            if not ready.done():
                ready.set_exception(StartError(message))
            elif not stop.is_set():
                logger.warning("MCP server %s: connection ended: %s", self.name, message)
                self._died(message)
        finally:
            self._client = None

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        """The SDK transport for the declaration, with ``${NAME}`` expanded."""
        spec = self.spec
        if spec.transport == "stdio":
            async with self._stdio_transport() as (read, write):
                yield _WatchedReadStream(read, self._output_closed), write
            return
        assert spec.url is not None
        url = self._expand(spec.url)
        headers = {key: self._expand(value) for key, value in spec.headers.items()}
        await self._check_url(url)
        if spec.transport == "sse":
            from mcp.client.sse import sse_client

            async with sse_client(url, headers=headers) as streams:
                yield streams
            return
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                yield streams

    def _stdio_transport(self) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        spec = self.spec
        assert spec.command is not None
        if not self.settings.allow_stdio:
            raise StartError(
                f"stdio MCP servers are turned off on this runner ({ENV_ALLOW_STDIO}=0)"
            )
        env = {name: self.env[name] for name in _EXTRA_SAFE_VARS if name in self.env}
        for key, value in spec.env.items():
            env[key] = self._expand(value)
        command = self._resolve_command(spec.command)
        args = list(spec.args)
        if sys.platform.startswith("linux"):
            args = ["-I", "-S", "-c", _PDEATHSIG_LAUNCHER, str(os.getpid()), command, *args]
            command = sys.executable
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=command, args=args, env=env, cwd=self.cwd)
        return stdio_client(params, errlog=self._errlog)

    def _expand(self, value: str) -> str:
        try:
            expanded = expand(value, allowed=self.settings.allowed_env, env=self.env)
        except ExpansionError as exc:
            raise StartError(str(exc)) from None
        if expanded != value:
            self._expanded.add(expanded)
            self._expanded.update(
                self.env[name] for name in self.settings.allowed_env if name in self.env
            )
        return expanded

    def _resolve_command(self, command: str) -> str:
        """The command's path (a relative path is the workspace's); a missing one is a
        startup failure with a plain message rather than a spawn error."""
        if os.sep in command or (os.altsep and os.altsep in command):
            path = Path(command)
            path = path if path.is_absolute() else self.cwd / path
            if not os.access(path, os.X_OK) or not path.is_file():
                raise StartError(f"command {command!r} does not exist or is not executable")
            return str(path)
        found = shutil.which(command, path=self.env.get("PATH") or os.defpath)
        if found is None:
            raise StartError(f"command {command!r} not found on the runner's PATH")
        return found

    async def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StartError("the url is not an http:// or https:// URL")
        if self.settings.allow_private_urls:
            return
        host = parts.hostname
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None)
        except (OSError, UnicodeError) as exc:
            raise StartError(f"cannot resolve the server's host: {exc}") from None
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                raise StartError(
                    f"the server's address is private and this runner refuses private "
                    f"addresses ({ENV_ALLOW_PRIVATE_URLS}=0)"
                )

    async def _list_tools(self, client: Any) -> list[McpTool]:
        allow = set(self.spec.tools) if self.spec.tools is not None else None
        tools: list[McpTool] = []
        cursor: str | None = None
        for _ in range(_MAX_TOOLS_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                if allow is not None and tool.name not in allow:
                    continue
                tools.append(
                    McpTool(
                        name=tool_name(self.name, tool.name),
                        server=self.name,
                        remote=tool.name,
                        description=tool.description or tool.title or "",
                        input_schema=dict(tool.input_schema or {}),
                    )
                )
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _describe(self, exc: BaseException) -> str:
        """One line for a failure, with the tail of a stdio server's stderr."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, StartError):
            message = str(exc)
        else:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        tail = self._stderr_tail()
        return self._scrub(f"{message} (stderr: {tail})" if tail else message)

    def _scrub(self, text: str) -> str:
        """``text`` without any header or env value, expanded or not, and without the
        URL's credentials: error messages reach the log, the stream and the model."""
        declared = [*self.spec.headers.values(), *self.spec.env.values()]
        # A value with ``${NAME}`` is shown by its name; what it became is in _expanded.
        secrets = {value for value in declared if "${" not in value} | self._expanded
        if self.spec.url:
            parts = urlsplit(self.spec.url)
            secrets |= {parts.password or "", parts.query}
        for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def _stderr_tail(self) -> str:
        errlog = self._errlog
        if errlog is None or errlog.closed:
            return ""
        try:
            errlog.flush()
            size = errlog.seek(0, os.SEEK_END)
            errlog.seek(max(0, size - _STDERR_TAIL * 4))
            text = errlog.read()
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-_STDERR_TAIL:]

    def _close_errlog(self) -> None:
        if self._errlog is not None:
            with contextlib.suppress(OSError):
                self._errlog.close()
            self._errlog = None

    def _set(self, status: Status, error: str | None) -> None:
        self.status, self.error = status, error
        if status != "ready":
            self.tools = []
        self.on_change()

    def _died(self, message: str) -> None:
        if self.status == "ready":
            self._set("failed", f"exited: {message}")

    def _output_closed(self) -> None:
        """A stdio server's output ended: it exited (or closed it, which is as fatal).
        Reported at once, also while no call is running, rather than at the next call;
        a call in flight reports it too and leaves the connection itself."""
        stop = self._stop
        if self._client is None or stop is None or stop.is_set() or self.status != "ready":
            return
        tail = self._stderr_tail()
        message = "the server closed its output"
        self._died(self._scrub(f"{message} (stderr: {tail})" if tail else message))
        if not self._calls:
            asyncio.get_running_loop().create_task(self._reap())

    # --- calls ----------------------------------------------------------------------------

    async def call(
        self,
        tool: McpTool | None,
        arguments: dict[str, Any],
        *,
        name: str = "",
        elicit: ElicitHandler | None = None,
    ) -> McpOutput:
        """Call ``tool`` with ``arguments``; the output the model sees. Never raises but
        ``CancelledError``; every failure is a ``{"error": ...}`` output."""
        client = self._client
        if client is None or self.status != "ready":
            why = f": {self.error}" if self.error else ""
            return _error(f"MCP server {self.name} is not running{why}")
        if tool is None:
            return _error(f"MCP server {self.name} offers no tool {name!r}")
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        record = self._calls.begin(self.spec.timeout, elicit)
        token = _CURRENT_CALL.set(record)
        try:
            result = await client.call_tool(tool.remote, arguments)
        except asyncio.CancelledError:
            if self._calls.timed_out(record):
                return _error(f"MCP call timed out after {self.spec.timeout:g} s")
            raise
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                message = self._describe(exc)
                self._died(message)
                asyncio.get_running_loop().create_task(self._reap())
                return _error(f"MCP server {self.name} exited: {message}")
            return _error(f"MCP server {self.name}: {self._scrub(str(exc))}")
        except Exception as exc:  # a transport failure, a result that does not validate
            message = self._scrub(f"{type(exc).__name__}: {exc}")
            logger.warning("MCP call %s failed: %s", tool.name, message)
            return _error(f"MCP server {self.name}: {message}")
        finally:
            _CURRENT_CALL.reset(token)
            self._calls.end(record)
        return render_result(result)

    async def _reap(self) -> None:
        """After the server died: leave the dead connection (keeping the failure)."""
        status, error = self.status, self.error
        await self.stop(report=False)
        self.status, self.error = status, error

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        """The SDK's elicitation callback: a form question goes to the turn's gate of
        the call it belongs to, with that call's deadline stopped while a person thinks.

        The current protocol's question (an ``input_required`` result) is handled inside
        the call's own task, so the call is known from its context; an older server's
        ``elicitation/create`` arrives on the connection's reader, so it belongs to the
        one call in flight, and is declined when several are (a shared server)."""
        from mcp_types import ElicitRequestFormParams, ElicitResult

        record = _CURRENT_CALL.get()
        if record is None or not self._calls.holds(record):
            record = self._calls.only()
        if record is None or record.elicit is None:
            return ElicitResult(action="decline")
        if not isinstance(params, ElicitRequestFormParams):
            return ElicitResult(action="decline")
        with self._calls.paused(record):
            action, content = await record.elicit(
                params.message, dict(params.requested_schema or {})
            )
        if action == "accept":
            return ElicitResult(action="accept", content=content or {})
        return ElicitResult(action=action)


class SharedMcpServers:
    """The runner's stdio servers declared ``shared: true`` (mcp.md): one process for
    the sessions whose declarations are identical, counted by the hubs that hold it.

    The key is the bundle's bytes (digest), the whole declaration and the working
    directory, so a process is never shared across bundles, folders or any difference
    in command, arguments or environment. Every state change of a shared server (a
    crash too) is reported to each holder; the last holder to let go stops it.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], tuple[McpServer, set[McpHub]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(spec: McpServerSpec, *, bundle: str, cwd: Path) -> tuple[str, ...]:
        declaration = repr((spec.name, spec.identity(), spec.tools, spec.timeout))
        return (bundle, declaration, str(cwd))

    def acquire(
        self, key: tuple[str, ...], hub: McpHub, make: Callable[[], McpServer]
    ) -> McpServer:
        entry = self._entries.get(key)
        if entry is None:
            server = make()
            holders: set[McpHub] = set()

            def changed() -> None:
                for holder in list(holders):
                    holder._changed()

            server.on_change = changed
            entry = self._entries[key] = (server, holders)
        entry[1].add(hub)
        return entry[0]

    async def release(self, key: tuple[str, ...], hub: McpHub) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        server, holders = entry
        holders.discard(hub)
        if holders:
            return
        del self._entries[key]
        await server.shutdown()


class McpHub:
    """A session's MCP servers: started together, offered to the model, stopped together.

    ``report`` receives the ``servers`` value of ``session.mcp_status`` on every change.
    ``starts`` bounds how many servers start at once on the runner (shared by sessions).
    With ``shared`` (the runner's registry) and ``bundle`` (a digest of the bundle's
    bytes), stdio servers declared ``shared: true`` come from the registry.
    """

    def __init__(
        self,
        specs: Sequence[McpServerSpec],
        *,
        cwd: Path,
        settings: McpSettings,
        env: Mapping[str, str],
        report: Callable[[dict[str, dict[str, Any]]], None],
        starts: asyncio.Semaphore,
        shared: SharedMcpServers | None = None,
        bundle: str = "",
    ) -> None:
        self._report = report
        self._starts = starts
        self._turns = 0
        self._closed = False
        self._shared = shared
        self._keys: dict[str, tuple[str, ...]] = {}  # shared servers' registry keys
        self._attempts: dict[str, int] = {}  # server name -> turn of its last restart
        self.servers: list[McpServer] = []
        for spec in specs:

            def make(spec: McpServerSpec = spec) -> McpServer:
                return McpServer(
                    spec=spec, cwd=cwd, settings=settings, env=env, on_change=self._changed
                )

            if shared is not None and spec.shared and spec.transport == "stdio":
                key = SharedMcpServers.key(spec, bundle=bundle, cwd=cwd)
                self._keys[spec.name] = key
                self.servers.append(shared.acquire(key, self, make))
            else:
                self.servers.append(make())
        self._opening: asyncio.Task[None] | None = None

    def open(self) -> None:
        """Start every server in the background (the first turn waits for them)."""
        self._opening = asyncio.create_task(self._open(), name="mcp-open")

    async def _open(self) -> None:
        await self._start(self.servers)
        if self._keys:
            # A shared server another session had ready changed nothing: report anyway.
            self._changed()

    async def ready(self) -> None:
        """Wait for the servers started by :meth:`open` (each is bounded)."""
        if self._opening is not None:
            await asyncio.shield(self._opening)

    async def begin_turn(self) -> None:
        """Wait for the opening starts; then restart each failed server, at most once per
        turn (not on the first turn, which follows the opening start)."""
        await self.ready()
        self._turns += 1
        again = [
            server
            for server in self.servers
            if server.status in ("failed", "stopped")
            and not (self._turns == 1 and self._attempts.get(server.name, 0) == 0)
            and self._attempts.get(server.name, 0) < self._turns
        ]
        for server in again:
            self._attempts[server.name] = self._turns
        if again:
            await self._start(again)

    async def _start(self, servers: Sequence[McpServer]) -> None:
        # The SDK's first import costs more than a second of CPU: in a thread, so other
        # sessions' turns go on, and before the start bound, which is the server's.
        await load_sdk()

        async def one(server: McpServer) -> None:
            async with self._starts:
                if not self._closed:
                    await server.ensure_started()

        await asyncio.gather(*(one(server) for server in servers))

    def tools(self) -> list[McpTool]:
        """The ready servers' tools, in declaration order, then each server's order."""
        return [
            tool for server in self.servers if server.status == "ready" for tool in server.tools
        ]

    def find(self, name: str) -> tuple[McpServer, McpTool | None] | None:
        """The server a namespaced name belongs to, and its tool while it is offered
        (None for a server that is not ready: its call then says why)."""
        for server in self.servers:
            for tool in server.tools:
                if tool.name == name:
                    return server, tool
        for server in self.servers:
            if name.startswith(f"{server.name}__"):
                return server, None
        return None

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of the servers' tools (or names one of the servers)."""
        return self.find(name) is not None

    def states(self) -> dict[str, dict[str, Any]]:
        """Each server's state; once this hub is closed, a shared server another session
        still holds is ``stopped`` as far as this session goes."""
        states = {}
        for server in self.servers:
            if self._closed and server.name in self._keys:
                states[server.name] = {
                    "status": "stopped",
                    "transport": server.spec.transport,
                    "tools": [],
                }
            else:
                states[server.name] = server.state()
        return states

    async def close(self) -> None:
        """Stop every server (in parallel); their process groups go with them. A shared
        server is let go, and stopped only by its last holder."""
        self._closed = True
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
            await asyncio.wait([self._opening], timeout=_STOP_TIMEOUT_S)

        async def one(server: McpServer) -> None:
            key = self._keys.get(server.name)
            if key is None or self._shared is None:
                await server.shutdown()
            else:
                await self._shared.release(key, self)

        await asyncio.gather(*(one(server) for server in self.servers))
        if self._keys:
            self._changed()

    def _changed(self) -> None:
        try:
            self._report(self.states())
        except Exception:
            logger.exception("reporting the MCP servers' state failed")


_SDK_LOADED = False


async def load_sdk() -> None:
    """Import the SDK's client modules once, off the event loop."""
    global _SDK_LOADED
    if not _SDK_LOADED:
        await asyncio.to_thread(_import_sdk)
        _SDK_LOADED = True


def _import_sdk() -> None:
    import mcp  # noqa: F401
    import mcp.client.sse  # noqa: F401
    import mcp.client.stdio  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401
    import mcp.shared._httpx_utils  # noqa: F401
    import mcp_types  # noqa: F401


# --- results ------------------------------------------------------------------------------

# Image types every model API that takes images accepts, with the bytes each starts with.
IMAGE_SIGNATURES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8, checked below
}
MAX_IMAGE_BYTES = 256 * 1024  # the images of one output together, decoded


@dataclass(frozen=True)
class McpOutput:
    """A call's output: the text the transcript stores as ``output`` and the images
    (``input_image`` parts with data URIs) the model is shown next to it."""

    text: str
    images: tuple[dict[str, str], ...] = ()


def render_result(result: Any) -> McpOutput:
    """A ``CallToolResult`` as the model's output (mcp.md): text blocks joined by
    newlines, an image as ``[image: <mime>, <n> bytes]`` in the text and, when it is a
    PNG, JPEG, GIF or WebP within the output's 256 KiB of images, as an image too;
    ``Error: `` first for ``isError``; the text cut past 256 KiB of UTF-8 with a note."""
    parts: list[str] = []
    images: list[dict[str, str]] = []
    budget = MAX_IMAGE_BYTES
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            raw = _decoded(block.data)
            mime = str(block.mime_type or "").lower()
            size = len(raw) if raw is not None else len(block.data)
            why = _image_refusal(mime, raw, budget)
            if why is None:
                assert raw is not None
                budget -= len(raw)
                encoded = base64.b64encode(raw).decode("ascii")
                images.append({"type": "input_image", "image_url": f"data:{mime};base64,{encoded}"})
                parts.append(f"[image: {block.mime_type}, {size} bytes]")
            else:
                parts.append(
                    f"[image: {block.mime_type}, {size} bytes; not shown to the model: {why}]"
                )
        elif kind == "audio":
            parts.append(f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource: {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        text = "Error: " + text
    return McpOutput(text=cut_output(text), images=tuple(images))


def _image_refusal(mime: str, raw: bytes | None, budget: int) -> str | None:
    """Why an image block is not passed to the model, or None when it is."""
    signatures = IMAGE_SIGNATURES.get(mime)
    if signatures is None:
        return "only PNG, JPEG, GIF and WebP images are"
    if (
        raw is None
        or not raw.startswith(signatures)
        or (mime == "image/webp" and raw[8:12] != b"WEBP")
    ):
        return f"the data is not a {mime} image"
    if len(raw) > budget:
        return f"the images of one tool output are limited to {MAX_IMAGE_BYTES // 1024} KiB"
    return None


def cut_output(text: str, limit: int = MAX_OUTPUT_BYTES) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    cut = len(data) - len(kept.encode("utf-8", "surrogatepass"))
    return f"{kept}\n[output cut: {cut} more bytes of {len(data)}]"


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None


def _decoded_size(data: str) -> int:
    raw = _decoded(data)
    return len(raw) if raw is not None else len(data)


def _error(message: str) -> McpOutput:
    return McpOutput(text=json.dumps({"error": message}, ensure_ascii=False))
