"""Debian's nginx for tests: the configuration ``manage.py deployconfig nginx`` renders,
checked with ``nginx -t`` and started unprivileged under a temporary prefix on a free
port (docs/testing.md). Every wait has a deadline; ``stop`` ends only the nginx this
module started (its master's pid)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from testing.processes import Process, base_env, free_port, spawn, wait_until

NGINX = "nginx"


def nginx_path() -> str | None:
    """nginx's executable (Debian puts it in /usr/sbin, often outside PATH)."""
    return shutil.which(NGINX) or shutil.which(NGINX, path="/usr/sbin:/usr/local/sbin")


def render(
    *,
    listen: str,
    upstreams: list[str],
    prefix: Path,
    tls: tuple[Path, Path] | None = None,
    **options: Any,
) -> Path:
    """What ``deployconfig nginx`` prints for these addresses (the same function, called
    in this process: starting Django again costs seconds), in ``<prefix>/nginx.conf``."""
    from omnigent_site.deploy import NginxOptions, render_nginx

    text = render_nginx(
        NginxOptions(
            listen=listen,
            upstreams=upstreams,
            prefix=str(prefix),
            tls_cert=str(tls[0]) if tls else None,
            tls_key=str(tls[1]) if tls else None,
            **options,
        )
    )
    prefix.mkdir(parents=True, exist_ok=True)
    path = prefix / "nginx.conf"
    path.write_text(text)
    return path


def check(config: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    """``nginx -t -c FILE -p DIR`` (its start-up messages to stderr, not /var/log)."""
    binary = nginx_path()
    assert binary is not None, "nginx is not installed"
    return subprocess.run(
        [binary, "-t", "-c", str(config), "-p", str(prefix), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A throw-away certificate for 127.0.0.1 (openssl)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@dataclass
class Nginx:
    url: str
    process: Process
    prefix: Path

    def stop(self) -> None:
        self.process.stop()


def start(
    *,
    upstreams: list[str],
    prefix: Path,
    log_dir: Path,
    tls: tuple[Path, Path] | None = None,
    name: str = "nginx",
    **options: Any,
) -> Nginx:
    """nginx in the foreground (``daemon off``) under ``prefix``, in front of
    ``upstreams``, on a free loopback port; returns once it answers. ``options``: more
    ``NginxOptions`` (shorter timeouts, no identity header clearing)."""
    binary = nginx_path()
    assert binary is not None, "nginx is not installed"
    port = free_port()
    config = render(
        listen=f"127.0.0.1:{port}", upstreams=upstreams, prefix=prefix, tls=tls, **options
    )
    checked = check(config, prefix)
    if checked.returncode != 0:
        raise RuntimeError(f"nginx -t refused the rendered configuration: {checked.stderr}")
    # Started by root (CI), the workers would run as nobody, who cannot enter pytest's
    # private temporary folders: they keep the test's user instead.
    globals_ = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
    process = spawn(
        name,
        [binary, "-c", str(config), "-p", str(prefix), "-e", "stderr", "-g", globals_],
        env=base_env(),
        log_dir=log_dir,
    )
    scheme = "https" if tls else "http"
    url = f"{scheme}://127.0.0.1:{port}"

    def listening() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"nginx exited: {process.log()[-2000:]}")
        return httpx.get(f"{url}/health", timeout=5.0, verify=False).status_code in (200, 503)

    try:
        wait_until(listening, deadline_s=30, what="nginx to answer")
    except BaseException:
        process.stop()
        raise
    return Nginx(url=url, process=process, prefix=prefix)
