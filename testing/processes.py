"""Real processes for end-to-end tests, benchmarks and the demo: daphne servers, runner
programs, throw-away PostgreSQL databases, and HTTP/SSE clients for them.

Every wait here has a deadline; processes are stopped (and killed if they do not
stop) when a test or a benchmark ends, and their output goes to log files that a
failing test prints.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 60.0
POLL_S = 0.05
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Callable[[], Any], *, deadline_s: float, what: str) -> Any:
    """Poll ``check`` until it returns a truthy value; fail with ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported at the deadline
            last_error = exc
        time.sleep(POLL_S)
    raise TimeoutError(
        f"timed out after {deadline_s:g} s waiting for {what} (last error: {last_error!r})"
    )


def base_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OMNIGENT_", "RUNNER_", "DJANGO_", "OPENAI_", "PYTEST_"))
        and key not in {"DATABASE_URL", "REDIS_URL"}
    }
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    # Test and benchmark servers speak plain HTTP on loopback: with DJANGO_DEBUG=0 the
    # production default would redirect every request to HTTPS (deployment.md, HTTPS).
    env["DJANGO_SECURE_SSL_REDIRECT"] = "0"
    # Tests and benchmarks send far more requests and open far more streams per user
    # than a client should: the client limits are tested in-process instead.
    env["OMNIGENT_THROTTLE_USER_RATE"] = "0"
    env["OMNIGENT_THROTTLE_RUNNER_RATE"] = "0"
    env["OMNIGENT_THROTTLE_POLL_RATE"] = "0"
    env["OMNIGENT_MAX_STREAMS_PER_USER"] = "0"
    env.update(extra)
    return env


def drop_redis_keys(prefix: str, *, url: str = REDIS_URL) -> int:
    """Delete the keys under ``prefix`` (a run's channel layer keys, which would expire
    anyway); return how many there were."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)
    finally:
        client.close()


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        return int(self.popen.returncode)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=15)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def spawn(name: str, args: list[str], *, env: dict[str, str], log_dir: Path) -> Process:
    """Start ``args`` with its output in ``<log_dir>/<name>.log``.

    The child starts with SIGINT at its default, as from a terminal. An ignored signal
    is inherited across ``exec``, and a test run started in the background (``cmd &``
    in a script) has SIGINT ignored: a server started from it would rightly ignore the
    SIGINT a test sends it (Python and Twisted leave an inherited ``SIG_IGN`` alone).
    """
    log_path = log_dir / f"{name}.log"
    handle = open(log_path, "ab")  # noqa: SIM115 - owned by the child process
    with default_sigint():
        popen = subprocess.Popen(args, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    handle.close()
    return Process(name=name, popen=popen, log_path=log_path)


@contextlib.contextmanager
def default_sigint() -> Iterator[None]:
    """SIGINT at its default for the children started inside (main thread only: the
    disposition can only be changed there, and it is restored at once)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass
class Server:
    """One daphne process serving the project's ASGI application."""

    url: str
    process: Process
    env: dict[str, str]

    def client(self, user: str | None = "alice@example.com", **kwargs: Any) -> httpx.Client:
        headers = {"X-Forwarded-Email": user} if user else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **kwargs)


def migrate(env: dict[str, str], log_dir: Path) -> None:
    """Bring the database ``env`` names up to the project's migrations.

    A SQLite file that does not exist yet becomes a copy of one migrated once per
    process (``migrated_sqlite_template``): ``manage.py migrate`` starts Django and
    applies every migration, seconds on this machine, and most end-to-end tests start
    their server on a fresh file. Any other database, and an existing file, goes
    through ``manage.py migrate`` itself.
    """
    target = _new_sqlite_file(env.get("DATABASE_URL", ""))
    if target is None:
        _run_migrate(env)
        return
    template = migrated_sqlite_template(env)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        contextlib.closing(sqlite3.connect(template)) as source,
        contextlib.closing(sqlite3.connect(target)) as copy,
    ):
        source.backup(copy)


_template_lock = threading.Lock()
_template: Path | None = None


def migrated_sqlite_template(env: dict[str, str]) -> Path:
    """A SQLite file migrated with ``manage.py migrate`` once per process.

    Every fresh migrate makes the same file: the migrations hold schema only (no
    ``RunPython``, which could read a test's settings), so the one made with the first
    caller's environment serves every later one. ``tests/unit/test_processes.py``
    compares a copy with a fresh migrate.
    """
    global _template
    with _template_lock:
        if _template is None:
            folder = Path(tempfile.mkdtemp(prefix="omnigent-migrated-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _run_migrate({**env, "DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}"})
            _template = folder / "db.sqlite3"
        return _template


def _new_sqlite_file(database_url: str) -> Path | None:
    """The file a ``sqlite:///`` URL names, if it does not exist yet; otherwise None."""
    prefix = "sqlite:///"
    if not database_url.startswith(prefix):
        return None
    path = Path(database_url[len(prefix) :])
    if not path.is_absolute() or path.exists():
        return None
    return path


def _run_migrate(env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrate failed: {result.stderr.decode(errors='replace')}")


def start_server(
    *,
    env: dict[str, str],
    log_dir: Path,
    name: str = "daphne",
    stack: contextlib.ExitStack | None = None,
) -> Server:
    """One daphne process (``python -m omnigent_site.serve``) on a free port, answering /health.

    Its output goes to ``<log_dir>/<name>.log``. With ``stack`` the process's ``stop`` is
    registered on it as soon as the process exists (so a failed start is stopped too);
    otherwise the caller stops ``server.process``.
    """
    port = free_port()
    process = spawn(
        name,
        [sys.executable, "-m", "omnigent_site.serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        log_dir=log_dir,
    )
    if stack is not None:
        stack.callback(process.stop)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{name} exited: {process.log()[-2000:]}")
        # Longer than /health's own 3 s bound on its checks, so a slow server says 503.
        return httpx.get(f"{url}/health", timeout=5.0).status_code == 200

    try:
        wait_until(healthy, deadline_s=START_DEADLINE_S, what=f"{name} to answer /health")
    except BaseException as exc:
        # The caller never sees a process that failed to start: stop it here (unless
        # ``stack`` does), and say what it printed.
        log_tail = process.log()[-2000:]
        if stack is None:
            process.stop()
        if isinstance(exc, TimeoutError):
            raise TimeoutError(f"{exc}; its log ends with:\n{log_tail}") from None
        raise
    return Server(url=url, process=process, env=env)


def restart_on_same_port(
    server: Server, log_dir: Path, name: str, *, sig: int = signal.SIGTERM
) -> Server:
    """Stop daphne (with ``sig``: SIGKILL for a crash) and start a new one on the same
    port and database, so runners find it at the URL they dial."""
    if sig == signal.SIGKILL:
        server.process.kill()
    else:
        server.process.stop(sig=sig)
    port = server.url.rsplit(":", 1)[1]
    process = spawn(
        name,
        [sys.executable, "-m", "omnigent_site.serve", "--host", "127.0.0.1", "--port", port],
        env=server.env,
        log_dir=log_dir,
    )
    restarted = Server(url=server.url, process=process, env=server.env)

    def healthy() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{name} exited: {process.log()[-2000:]}")
        try:
            return httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, deadline_s=START_DEADLINE_S, what=f"{name} to answer /health")
    return restarted


@dataclass
class Runner:
    runner_id: str
    token: str
    workspace: Path
    process: Process | None = None
    env: dict[str, str] = field(default_factory=dict)


def runner_env(*, server_url: str, token: str, workspace: Path, **extra: str) -> dict[str, str]:
    """The runner program's environment: its server, token and workspace, and this
    process as its parent (it stops when this process dies); ``extra`` adds to it."""
    return base_env(
        RUNNER_SERVER_URL=server_url,
        OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN=token,
        OMNIGENT_RUNNER_WORKSPACE=str(workspace),
        OMNIGENT_RUNNER_PARENT_PID=str(os.getpid()),
        **extra,
    )


def start_runner(
    *,
    server: Server,
    token: str,
    runner_id: str,
    workspace: Path,
    log_dir: Path,
    extra_env: dict[str, str] | None = None,
    name: str = "runner",
    command: list[str] | None = None,
) -> Runner:
    """Start the runner program (``command``: another way to start it, e.g. the wheel's
    ``omnigent-runner`` script) and wait until the server reports it online."""
    env = runner_env(server_url=server.url, token=token, workspace=workspace, **(extra_env or {}))
    argv = command or [sys.executable, "-m", "omnigent_runner"]
    process = spawn(name, argv, env=env, log_dir=log_dir)
    runner = Runner(runner_id=runner_id, token=token, workspace=workspace, process=process, env=env)
    wait_runner_online(server, runner_id, process=process)
    return runner


def wait_runner_online(
    server: Server,
    runner_id: str,
    *,
    process: Process | None = None,
    online: bool = True,
    user: str | None = "alice@example.com",
    deadline_s: float = START_DEADLINE_S,
) -> None:
    """Poll the runner's status as ``user`` (its owner) until ``online`` is as wanted.

    ``user=None`` sends no identity header (local single-user mode).
    """
    with server.client(user) as client:

        def reached() -> bool:
            if process is not None and process.popen.poll() is not None:
                raise RuntimeError(f"runner exited: {process.log()[-2000:]}")
            body = client.get(f"/v1/runners/{runner_id}/status").json()
            return body.get("online") is online

        wait_until(reached, deadline_s=deadline_s, what=f"runner {runner_id} online={online}")


@contextlib.contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database named ``<prefix><random>``; its URL is yielded.

    Created through :data:`PG_ADMIN_URL` and dropped afterwards with ``WITH (FORCE)``,
    so connections a stopped process left open do not keep it alive.
    """
    import psycopg

    name = f"{prefix}{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def register_runner(
    server: Server, *, user: str = "alice@example.com", name: str = "e2e"
) -> tuple[str, str]:
    with server.client(user) as client:
        response = client.post("/v1/runners", json={"name": name})
        response.raise_for_status()
        body = response.json()
    return body["runner_id"], body["binding_token"]


def create_session(
    server: Server, bundle: bytes, *, user: str = "alice@example.com", title: str = "e2e"
) -> str:
    with server.client(user) as client:
        response = client.post(
            "/v1/sessions",
            files={"bundle": ("agent.tar.gz", bundle, "application/gzip")},
            data={"metadata": json.dumps({"title": title})},
        )
        response.raise_for_status()
        return str(response.json()["session_id"])


def bind(
    server: Server, session_id: str, runner_id: str, *, user: str = "alice@example.com"
) -> dict[str, Any]:
    with server.client(user) as client:
        response = client.patch(f"/v1/sessions/{session_id}", json={"runner_id": runner_id})
        response.raise_for_status()
        return dict(response.json())


def send_message(
    server: Server,
    session_id: str,
    text: str,
    *,
    tools: list | None = None,
    user: str = "alice@example.com",
) -> httpx.Response:
    body: dict[str, Any] = {"type": "message", "data": {"role": "user", "content": text}}
    if tools:
        body["tools"] = tools
    with server.client(user) as client:
        return client.post(f"/v1/sessions/{session_id}/events", json=body)


def wait_turn(
    server: Server,
    session_id: str,
    response_id: str,
    *,
    statuses: tuple[str, ...] = ("completed", "failed", "cancelled"),
    deadline_s: float = 60.0,
) -> dict[str, Any]:
    with server.client() as client:

        def finished() -> dict[str, Any] | None:
            body = client.get(f"/v1/sessions/{session_id}/responses/{response_id}").json()
            return body if body.get("status") in statuses else None

        return dict(
            wait_until(
                finished, deadline_s=deadline_s, what=f"turn {response_id} to reach {statuses}"
            )
        )


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, str, str]]:
    """Parse SSE lines into (id, event, data) triples; stops at the end of the stream."""
    event_id: str | None = None
    event_type = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield event_id, event_type, "\n".join(data)
            event_id, event_type, data = None, "message", []
            continue
        field_name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field_name == "id":
            event_id = value
        elif field_name == "event":
            event_type = value
        elif field_name == "data":
            data.append(value)


@dataclass
class StreamEvent:
    id: int | None
    type: str
    data: Any

    @property
    def done(self) -> bool:
        return self.data == "[DONE]"


class StreamReader:
    """Reads a session stream (or, with ``path``, another stream such as
    ``/v1/sessions/updates``) in a thread until ``until(event)`` is true or the stream
    ends."""

    def __init__(
        self,
        server: Server,
        session_id: str = "",
        *,
        path: str | None = None,
        user: str | None = "alice@example.com",
        last_event_id: int | None = None,
        until: Callable[[StreamEvent], bool] = lambda event: False,
    ) -> None:
        import queue
        import threading

        self.events: list[StreamEvent] = []
        self.status_code: int | None = None
        self.headers: dict[str, str] = {}
        self.error: BaseException | None = None
        self._until = until
        self._connected = threading.Event()
        self._finished = threading.Event()
        self._queue: queue.Queue[StreamEvent] = queue.Queue()
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self._client = server.client(user)
        self._thread = threading.Thread(
            target=self._run,
            args=(path or f"/v1/sessions/{session_id}/stream", headers),
            daemon=True,
        )
        self._thread.start()

    def _run(self, path: str, headers: dict[str, str]) -> None:
        try:
            with self._client.stream("GET", path, headers=headers) as response:
                self.status_code = response.status_code
                self.headers = dict(response.headers)
                self._connected.set()
                if response.status_code != 200:
                    response.read()
                    self.body = response.text
                    return
                for event_id, event_type, data in sse_events(response.iter_lines()):
                    parsed: Any = data if data == "[DONE]" else json.loads(data)
                    event = StreamEvent(int(event_id) if event_id else None, event_type, parsed)
                    self.events.append(event)
                    self._queue.put(event)
                    if event.done or self._until(event):
                        return
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            self.error = exc
        finally:
            self._connected.set()
            self._finished.set()
            self._client.close()

    def wait_connected(self, deadline_s: float = 30.0) -> None:
        if not self._connected.wait(deadline_s):
            raise TimeoutError("the stream did not answer")

    def wait(self, deadline_s: float = 60.0) -> list[StreamEvent]:
        if not self._finished.wait(deadline_s):
            raise TimeoutError(f"the stream did not finish in {deadline_s:g} s; got {self.types()}")
        if self.error is not None:
            raise self.error
        return self.events

    def wait_for(
        self, predicate: Callable[[StreamEvent], bool], deadline_s: float = 60.0
    ) -> StreamEvent:
        import queue

        end = time.monotonic() + deadline_s
        seen = [event for event in list(self.events) if predicate(event)]
        if seen:
            return seen[0]
        while time.monotonic() < end:
            try:
                event = self._queue.get(timeout=min(0.5, max(end - time.monotonic(), 0.01)))
            except queue.Empty:
                if self._finished.is_set() and self._queue.empty():
                    break
                continue
            if predicate(event):
                return event
        raise TimeoutError(f"no matching stream event; got {self.types()}")

    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def payloads(self) -> list[tuple[int | None, str, Any]]:
        return [(event.id, event.type, event.data) for event in self.events if event.id is not None]


def is_final_idle(event: StreamEvent) -> bool:
    return event.type == "session.status" and event.data.get("status") in ("idle", "failed")
