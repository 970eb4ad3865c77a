"""``manage.py deployconfig`` (operations.md): the shipped ``deploy/`` files are its
renderings, Debian's ``nginx -t`` accepts what it prints (plain and TLS), and
``systemd-analyze verify`` finds nothing to say about the units."""

from __future__ import annotations

import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from omnigent_runner.config import ENV_TOKEN_FILE, ConfigError, load_config
from omnigent_runner.identity import derive_runner_id
from testing import nginx
from testing.processes import REPO
from tests.conftest import IN_CI

DEPLOY = REPO / "deploy"
EXAMPLE_UPSTREAMS = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]


def deployconfig(*args: str) -> str:
    out = StringIO()
    call_command("deployconfig", *args, stdout=out)
    return out.getvalue()


def upstream_args(upstreams: list[str]) -> list[str]:
    return [arg for upstream in upstreams for arg in ("--upstream", upstream)]


def require(tool: str | None, name: str) -> str:
    if tool:
        return tool
    if IN_CI:
        pytest.fail(f"{name} is not installed (CI=true requires it; .ci/run installs it)")
    pytest.skip(f"{name} is not installed")


def test_the_shipped_nginx_conf_is_the_rendering_for_the_documented_addresses() -> None:
    rendered = deployconfig(
        "nginx",
        "--listen",
        "0.0.0.0:443",
        "--server-name",
        "omnigent.example.com",
        "--tls-cert",
        "/etc/ssl/certs/omnigent.pem",
        "--tls-key",
        "/etc/ssl/private/omnigent.key",
        *upstream_args(EXAMPLE_UPSTREAMS),
    )
    assert (DEPLOY / "nginx.conf").read_text() == rendered, (
        "deploy/nginx.conf is stale: render it again (docs/deployment.md)"
    )


def test_every_header_is_set_at_the_server_level() -> None:
    """nginx forgets the server block's ``proxy_set_header`` lines in a location that
    sets one of its own: the identity header's clearing, X-Forwarded-For and the
    upgrade headers would silently go missing there."""
    text = (DEPLOY / "nginx.conf").read_text()
    inside_location = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("location "):
            inside_location = True
        elif stripped == "}" and inside_location:
            inside_location = False
        elif stripped.startswith("proxy_set_header"):
            assert not inside_location, line
    assert 'proxy_set_header X-Forwarded-Email "";' in text
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in text


def test_the_shipped_units_are_the_rendering_for_the_documented_addresses(
    tmp_path: Path,
) -> None:
    deployconfig("systemd", *upstream_args(EXAMPLE_UPSTREAMS), "--output", str(tmp_path))
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(path.name for path in (DEPLOY / "systemd").iterdir())
    for name in names:
        assert (DEPLOY / "systemd" / name).read_text() == (tmp_path / name).read_text(), name
    assert "--port %i" in (tmp_path / "omnigent@.service").read_text()
    target = (tmp_path / "omnigent.target").read_text()
    assert "omnigent@8001.service omnigent@8002.service omnigent@8003.service" in target
    assert "omnigent-webhooks.service" in target
    assert "manage.py deliverwebhooks" in (tmp_path / "omnigent-webhooks.service").read_text()


def test_the_procfile_starts_the_documented_launcher() -> None:
    lines = (DEPLOY / "Procfile").read_text().splitlines()
    assert "web: python -m omnigent_site.serve --host 0.0.0.0 --port $PORT" in lines
    assert "release: python manage.py migrate --noinput" in lines
    assert "webhooks: python manage.py deliverwebhooks" in lines


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tls", [False, True])
def test_nginx_accepts_what_deployconfig_prints(tmp_path: Path, tls: bool) -> None:
    require(nginx.nginx_path(), "nginx")
    certificate = nginx.self_signed_certificate(tmp_path) if tls else None
    prefix = tmp_path / "nginx"
    config = nginx.render(
        listen="127.0.0.1:18443",
        upstreams=["127.0.0.1:8001", "[::1]:8002"],
        prefix=prefix,
        tls=certificate,
    )
    text = config.read_text()
    assert "events {" in text and "http {" in text
    assert f"pid {prefix / 'nginx.pid'};" in text
    checked = nginx.check(config, prefix)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


@pytest.mark.timeout(60)
def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    analyze = require(shutil.which("systemd-analyze"), "systemd-analyze")
    python = str(Path(sys.executable).resolve())
    deployconfig(
        "systemd",
        *upstream_args(["127.0.0.1:8001", "127.0.0.1:8002"]),
        "--python",
        python,
        "--runner-command",
        python,
        "--app-dir",
        str(REPO),
        "--runner-workspace",
        str(tmp_path),
        "--user",
        "root",
        "--output",
        str(tmp_path),
    )
    result = subprocess.run(
        [analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.glob("omnigent*"))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0 and "Failed to" in result.stderr and "bus" in result.stderr.lower():
        pytest.skip(f"systemd-analyze cannot run here: {result.stderr[:200]}")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["nginx", "--listen", "nowhere", "--upstream", "127.0.0.1:8001"],
        ["nginx", "--listen", "127.0.0.1:80", "--upstream", "127.0.0.1:99999"],
        ["nginx", "--listen", "127.0.0.1:80", "--upstream", "a;b:1"],
        ["nginx", "--listen", "127.0.0.1:80", "--upstream", "127.0.0.1:1", "--tls-cert", "c"],
        ["systemd", "--upstream", "10.0.0.1:8001", "--upstream", "10.0.0.2:8001"],
    ],
)
def test_bad_options_are_refused(args: list[str]) -> None:
    with pytest.raises(CommandError):
        deployconfig(*args)


def test_the_runner_reads_its_token_from_a_credentials_file(tmp_path: Path) -> None:
    token = "tok_" + "x" * 40
    (tmp_path / "binding-token").write_text(token + "\n")
    config = load_config([], {ENV_TOKEN_FILE: str(tmp_path / "binding-token")})
    assert config.token == token
    assert config.runner_id == derive_runner_id(token)
    with pytest.raises(ConfigError) as refused:
        load_config([], {ENV_TOKEN_FILE: str(tmp_path / "missing")})
    assert "missing" in str(refused.value)
