"""``manage.py runlocal``: the quickstart — daphne on loopback plus one local runner.

Runs in local single-user mode on loopback, so requests without identity act as
the user ``local`` and the local runner's token is registered on first connect.
The token is kept in ``var/local-runner-token`` so the runner id stays the same
across restarts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from omnigent_runner.identity import derive_runner_id, new_binding_token
from omnigent_site.runtime.server import WHERE_TO_GO
from omnigent_site.users import get_or_create_user

# The mock LLM's port unless --mock-port says otherwise: fixed, so a runner started by
# hand against it (OPENAI_BASE_URL=http://127.0.0.1:8765/v1) keeps working across restarts.
DEFAULT_MOCK_PORT = 8765
HEALTH_DEADLINE_S = 30.0
MOCK_LLM_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
POLL_S = 0.5


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_runner_token(path: Path) -> str:
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_binding_token()
    path.write_text(token + "\n", encoding="utf-8")
    path.chmod(0o600)
    return token


@contextlib.contextmanager
def terminal_job() -> Iterator[None]:
    """Run as the terminal's foreground job, as a shell runs a command.

    Ctrl-C signals the terminal's whole foreground process group. Under ``make run``
    that includes make, which then reports ``*** [run] Interrupt`` and fails even when
    this command stopped cleanly. In a process group of its own that owns the terminal,
    Ctrl-C reaches only this command (its children run in process groups of their own,
    and it stops them); the terminal goes back to the
    previous group on the way out. Without a controlling terminal (a script, CI),
    nothing changes.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        yield
        return
    previous = -1
    try:
        foreground = os.tcgetpgrp(tty)
        if foreground == os.getpgrp():  # in the foreground (not started with &)
            os.setpgid(0, 0)
            _set_foreground(tty, os.getpgrp())
            previous = foreground
    except OSError:
        pass
    try:
        yield
    finally:
        if previous != -1:
            try:
                _set_foreground(tty, previous)
            except OSError:
                pass
        os.close(tty)


def _set_foreground(tty: int, group: int) -> None:
    """``tcsetpgrp`` from a background group needs SIGTTOU ignored while it runs."""
    handler = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, group)
    finally:
        signal.signal(signal.SIGTTOU, handler)


def _check_port_free(host: str, port: int) -> None:
    """Fail with what to do if ``port`` is taken (as the mock LLM would bind it: with
    ``SO_REUSEADDR``, so a port its previous run just left is free)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise CommandError(
                f"the mock LLM's port {port} on {host} is taken ({exc.strerror}): another "
                "make run LLM=mock? Choose another with --mock-port (make run LLM=mock "
                "MOCK_PORT=…), or 0 for any free port"
            ) from None


def start_child(
    argv: list[str],
    *,
    env: dict[str, str],
    quiet: threading.Event,
    on_line: Callable[[str], bool] | None = None,
) -> subprocess.Popen[str]:
    """Start a child whose output this command relays, line by line, until ``quiet``.

    Once a stop is asked for, what the children log while they shut down (the runner
    leaving, the tunnel closing) is not shown: a clean stop prints one line, this
    command's. ``on_line`` may take a line for itself (True: not shown).
    """
    process = subprocess.Popen(
        argv,
        env={**env, "PYTHONUNBUFFERED": "1"},
        # Its own process group: Ctrl-C reaches only this command, which quiets the
        # output and then stops the children in order (not all at once, racing it).
        process_group=0,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )

    def relay() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if on_line is not None and on_line(line):
                continue
            if not quiet.is_set():
                sys.stdout.write(line)
                sys.stdout.flush()

    threading.Thread(target=relay, name=f"output-{argv[2]}", daemon=True).start()
    return process


class MockLLM:
    """The bundled mock LLM as a child process (``--llm mock``), scripted for the README
    walkthrough; each answer it gives is printed as one line."""

    def __init__(
        self, host: str, port: int, *, env: dict[str, str], quiet: threading.Event
    ) -> None:
        self.base_url = ""
        self._ready = threading.Event()
        argv = [sys.executable, "-m", "testing.mockllm", "--host", host]
        argv += ["--port", str(port), "--walkthrough", "--announce"]
        self.process = start_child(argv, env=env, quiet=quiet, on_line=self._url_line)

    def _url_line(self, line: str) -> bool:
        if not line.startswith("MOCKLLM_URL="):
            return False
        self.base_url = line.strip().split("=", 1)[1]
        self._ready.set()
        return True

    def wait_ready(self) -> str:
        deadline = time.monotonic() + MOCK_LLM_DEADLINE_S
        while not self._ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise CommandError("the mock LLM did not start (its output is above)")
        return self.base_url


class Command(BaseCommand):
    help = "Start daphne on loopback with a connected local runner (the embedded defaults)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workspace", default="./workspace")
        parser.add_argument("--no-runner", action="store_true", help="start only the server")
        parser.add_argument(
            "--llm",
            choices=["env", "mock"],
            default="env",
            help=(
                "env: the runner uses OPENAI_API_KEY / OPENAI_BASE_URL (or the bundle's "
                "executor.auth); mock: the bundled mock LLM, offline, scripted for the "
                "README walkthrough"
            ),
        )
        parser.add_argument(
            "--mock-port",
            type=int,
            default=DEFAULT_MOCK_PORT,
            help=(
                f"port of the mock LLM with --llm mock (default {DEFAULT_MOCK_PORT}, the same "
                "at every start; 0: any free port)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with terminal_job():
            self._run(options)

    def _run(self, options: dict[str, Any]) -> None:
        host, port = options["host"], options["port"]
        if not _is_loopback_host(host):
            # Single-user mode trusts every caller and every loopback runner token.
            raise CommandError(
                f"runlocal serves loopback only (got --host {host}); "
                "see docs/deployment.md to serve other machines"
            )
        mock_port = options["mock_port"]
        if not 0 <= mock_port <= 65535:
            raise CommandError(f"--mock-port must be 0 to 65535 (got {mock_port})")
        if options["llm"] == "mock" and not options["no_runner"] and mock_port:
            _check_port_free(host, mock_port)  # before anything starts
        workspace = Path(options["workspace"]).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        base_url = f"http://{host}:{port}"
        env = {**os.environ, "OMNIGENT_LOCAL_SINGLE_USER": "1"}
        get_or_create_user(settings.OMNIGENT_LOCAL_USER)

        # Ctrl-C (or SIGTERM, or the terminal closing) reaches this process only: it
        # stops the children in order and exits 0 with one line. A child that exits
        # while nobody asked for a stop is an error (exit 1).
        stop_requested = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda *_: stop_requested.set())

        children: list[tuple[str, subprocess.Popen[Any]]] = []
        try:
            server = start_child(
                [sys.executable, "-m", "omnigent_site.serve", "--host", host, "--port", str(port)],
                env=env,
                quiet=stop_requested,
                # This command says where to go itself, once everything is up.
                on_line=lambda line: f"omnigent_site.runtime.server: {WHERE_TO_GO}" in line,
            )
            children.append(("server", server))
            self._wait_healthy(base_url, server, stop_requested)
            self.stdout.write(f"server: {base_url} (local single-user mode, user 'local')")
            if settings.OMNIGENT_WEBHOOK_DELIVERY == "worker":
                worker = start_child(
                    [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "deliverwebhooks"],
                    env=env,
                    quiet=stop_requested,
                )
                children.append(("webhook worker", worker))
                self.stdout.write("webhooks: sent by a worker process (manage.py deliverwebhooks)")
            if not options["no_runner"]:
                runner_env = {
                    **env,
                    "RUNNER_SERVER_URL": base_url,
                    "OMNIGENT_RUNNER_WORKSPACE": str(workspace),
                    "OMNIGENT_RUNNER_PARENT_PID": str(os.getpid()),
                }
                if options["llm"] == "mock":
                    mock = MockLLM(host, mock_port, env=env, quiet=stop_requested)
                    children.append(("mock LLM", mock.process))
                    runner_env["OPENAI_BASE_URL"] = mock.wait_ready()
                    runner_env["OPENAI_API_KEY"] = "mock"
                    self.stdout.write(
                        f"LLM: the bundled mock at {runner_env['OPENAI_BASE_URL']} (offline; "
                        "it answers 'Write hello.txt' with a sys_os_write call)"
                    )
                token = local_runner_token(Path(settings.BASE_DIR) / "var" / "local-runner-token")
                runner_env["OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN"] = token
                runner = start_child(
                    [sys.executable, "-m", "omnigent_runner"], env=runner_env, quiet=stop_requested
                )
                children.append(("runner", runner))
                self.stdout.write(f"runner: {derive_runner_id(token)} on {workspace}")
            self.stdout.write(f"Open {base_url}/ in a browser (the API is at {base_url}/v1/).")
            self.stdout.write("Press Ctrl-C to stop.")
            exited = self._wait_for_exit(children, stop_requested)
        finally:
            _stop(children)
        if exited is not None:
            name, code = exited
            raise CommandError(f"the {name} exited with code {code}; stopped the rest")
        self.stdout.write("Stopped.")

    @staticmethod
    def _wait_for_exit(
        children: list[tuple[str, subprocess.Popen[Any]]], stop_requested: threading.Event
    ) -> tuple[str, int] | None:
        """Wait for a stop signal (None) or a child's own exit ((name, exit code))."""
        while not stop_requested.wait(POLL_S):
            for name, child in children:
                if child.poll() is not None:
                    return name, int(child.returncode)
        return None

    def _wait_healthy(
        self, base_url: str, server: subprocess.Popen[Any], stop_requested: threading.Event
    ) -> None:
        deadline = time.monotonic() + HEALTH_DEADLINE_S
        while time.monotonic() < deadline and not stop_requested.is_set():
            if server.poll() is not None:
                raise CommandError(f"daphne exited with code {server.returncode}")
            try:
                if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            stop_requested.wait(0.2)
        if stop_requested.is_set():
            return
        raise CommandError(f"the server did not become healthy within {HEALTH_DEADLINE_S:g} s")


def _stop(children: list[tuple[str, subprocess.Popen[Any]]]) -> None:
    """Stop the children, newest first (the runner leaves before its server)."""
    for _name, child in reversed(children):
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
