"""``manage.py runlocal``: the quickstart — daphne on loopback plus one local runner.

Runs in local single-user mode on loopback, so requests without identity act as
the user ``local`` and the local runner's token is registered on first connect.
The token is kept in ``var/local-runner-token`` so the runner id stays the same
across restarts.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from omnigent_runner.identity import derive_runner_id, new_binding_token
from omnigent_site.users import get_or_create_user

HEALTH_DEADLINE_S = 30.0


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


class Command(BaseCommand):
    help = "Start daphne on loopback with a connected local runner (the embedded defaults)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workspace", default="./workspace")
        parser.add_argument("--no-runner", action="store_true", help="start only the server")

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        if not _is_loopback_host(host):
            # Single-user mode trusts every caller and every loopback runner token.
            raise CommandError(
                f"runlocal serves loopback only (got --host {host}); "
                "see docs/deployment.md to serve other machines"
            )
        workspace = Path(options["workspace"]).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        base_url = f"http://{host}:{port}"
        env = {**os.environ, "OMNIGENT_LOCAL_SINGLE_USER": "1"}
        get_or_create_user(settings.OMNIGENT_LOCAL_USER)

        server = subprocess.Popen(
            [sys.executable, "-m", "omnigent_site.serve", "--host", host, "--port", str(port)],
            env=env,
        )
        children = [server]

        def stop(*_: Any) -> None:
            for child in reversed(children):
                if child.poll() is None:
                    child.terminate()
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()

        def stop_and_exit(*_: Any) -> None:
            stop()
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop_and_exit)
        try:
            self._wait_healthy(base_url, server)
            self.stdout.write(f"server: {base_url} (local single-user mode, user 'local')")
            if not options["no_runner"]:
                token = local_runner_token(Path(settings.BASE_DIR) / "var" / "local-runner-token")
                runner_env = {
                    **env,
                    "RUNNER_SERVER_URL": base_url,
                    "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": token,
                    "OMNIGENT_RUNNER_WORKSPACE": str(workspace),
                    "OMNIGENT_RUNNER_PARENT_PID": str(os.getpid()),
                }
                children.append(
                    subprocess.Popen([sys.executable, "-m", "omnigent_runner"], env=runner_env)
                )
                self.stdout.write(f"runner: {derive_runner_id(token)} on {workspace}")
            self.stdout.write("Press Ctrl-C to stop.")
            while all(child.poll() is None for child in children):
                time.sleep(0.5)
            raise CommandError("a child process exited; stopping")
        except KeyboardInterrupt:
            pass
        finally:
            stop()

    def _wait_healthy(self, base_url: str, server: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + HEALTH_DEADLINE_S
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise CommandError(f"daphne exited with code {server.returncode}")
            try:
                if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise CommandError(f"the server did not become healthy within {HEALTH_DEADLINE_S:g} s")
