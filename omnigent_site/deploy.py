"""The production deployment's configuration files, rendered for given addresses
(operations.md, "The deployment, shipped and tested"; docs/deployment.md).

``manage.py deployconfig nginx …`` prints ``render_nginx``'s ``nginx.conf`` and
``manage.py deployconfig systemd …`` ``render_systemd``'s units; the files under
``deploy/`` are these renderings for the example addresses the deployment page uses
(``tests/unit/test_deployconfig.py`` fails when they drift apart), and the end-to-end
test starts Debian's nginx from the same renderer. Every limit and timeout in them is
derived from the server's own settings, so they change together.
"""

from __future__ import annotations

import ipaddress
import math
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from django.conf import settings

MIB = 1024 * 1024
# The tunnel and the two event streams stay open for hours with traffic every
# OMNIGENT_HEARTBEAT_S / OMNIGENT_STREAM_HEARTBEAT_S; nginx closes a proxied connection
# that is silent for its read timeout, so it must be well above both heartbeats.
LONG_READ_TIMEOUT_S = 3600
# Everything else: the longest an ordinary request waits is a relay to a runner
# (OMNIGENT_RELAY_TIMEOUT_S) or a workspace download, far below this.
READ_TIMEOUT_S = 120
CONNECT_TIMEOUT_S = 5


class DeployConfigError(ValueError):
    """An option that cannot be rendered (the message says which and why)."""


def parse_address(value: str, *, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DeployConfigError(f"{what} must be HOST:PORT, not {value!r}")
    host = host.strip("[]")
    if any(char.isspace() or char in ";{}'\"" for char in host):
        raise DeployConfigError(f"{what}: {host!r} is not a host name or address")
    return host, int(port)


def _nginx_address(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def body_limit_mib() -> int:
    """nginx's ``client_max_body_size``: the largest body the server itself accepts (a
    session file upload with its framing, a bundle upload, a base64 workspace write),
    rounded up to MiB, so nginx never refuses what the server would take."""
    largest = max(
        settings.OMNIGENT_MAX_UPLOAD_BYTES + settings.OMNIGENT_UPLOAD_OVERHEAD_BYTES,
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    )
    return math.ceil(largest / MIB)


@dataclass
class NginxOptions:
    listen: str
    upstreams: list[str]
    server_name: str = "_"
    tls_cert: str | None = None
    tls_key: str | None = None
    # Where pid, logs and temporary files go; None: nginx's own (Debian's) places.
    prefix: str | None = None
    identity_header: str = field(default_factory=lambda: settings.OMNIGENT_AUTH_HEADER)
    # Not command-line options: the end-to-end test shortens them to outlast them quickly.
    read_timeout_s: int = READ_TIMEOUT_S
    long_read_timeout_s: int = LONG_READ_TIMEOUT_S


def render_nginx(options: NginxOptions) -> str:
    """A complete ``nginx.conf`` (``events {}`` and ``http {}``) that ``nginx -t``
    accepts, for a proxy in front of ``options.upstreams``."""
    listen_host, listen_port = parse_address(options.listen, what="--listen")
    upstreams = [parse_address(value, what="--upstream") for value in options.upstreams]
    if not upstreams:
        raise DeployConfigError("at least one --upstream HOST:PORT is needed")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise DeployConfigError("--tls-cert and --tls-key go together")
    if any(char.isspace() or char in ";{}" for char in options.server_name):
        raise DeployConfigError(f"--server-name {options.server_name!r} is not a host name")
    tls = bool(options.tls_cert)
    prefix = PurePosixPath(options.prefix) if options.prefix else None
    identity = options.identity_header

    def path(name: str) -> str:
        assert prefix is not None
        return str(prefix / name)

    lines: list[str] = [
        "# nginx in front of the Omnigent server processes (docs/deployment.md).",
        "# Rendered by `python manage.py deployconfig nginx` for the addresses given.",
        "worker_processes auto;",
    ]
    if prefix is not None:
        lines += [f"pid {path('nginx.pid')};", f"error_log {path('error.log')} warn;"]
    lines += [
        "",
        "events {",
        "    worker_connections 8192;",
        "}",
        "",
        "http {",
        "    default_type application/octet-stream;",
        "    server_tokens off;",
        "    sendfile on;",
        "    tcp_nodelay on;",
        "    keepalive_timeout 65s;",
    ]
    if prefix is not None:
        lines += [
            f"    client_body_temp_path {path('client_body')};",
            f"    proxy_temp_path {path('proxy')};",
            f"    fastcgi_temp_path {path('fastcgi')};",
            f"    uwsgi_temp_path {path('uwsgi')};",
            f"    scgi_temp_path {path('scgi')};",
        ]
    lines += [
        "",
        "    # The client's X-Request-ID when it sent one, else nginx's own: the server",
        "    # returns it and logs it (OMNIGENT_LOG_FORMAT=json), and so does this log.",
        "    map $http_x_request_id $omnigent_request_id {",
        "        default $http_x_request_id;",
        '        "" $request_id;',
        "    }",
        "    # WebSocket upgrade for runner tunnels; other requests keep the upstream",
        "    # connection alive.",
        "    map $http_upgrade $omnigent_connection {",
        "        default upgrade;",
        '        "" "";',
        "    }",
        "    log_format omnigent '$remote_addr [$time_iso8601] \"$request_method $uri\" '",
        "        '$status $body_bytes_sent $request_time $upstream_addr $omnigent_request_id';",
    ]
    access_log = path("access.log") if prefix is not None else "/var/log/nginx/omnigent.access.log"
    lines.append(f"    access_log {access_log} omnigent;")
    lines += [
        "",
        "    upstream omnigent {",
        "        # Any process serves any request: no sticky sessions (docs/deployment.md).",
    ]
    lines += [
        f"        server {_nginx_address(host, port)} max_fails=1 fail_timeout=2s;"
        for host, port in upstreams
    ]
    lines += [
        "        keepalive 64;",
        "    }",
        "",
        "    server {",
        f"        listen {_nginx_address(listen_host, listen_port)}{' ssl' if tls else ''};",
        f"        server_name {options.server_name};",
    ]
    if tls:
        lines += [
            f"        ssl_certificate {options.tls_cert};",
            f"        ssl_certificate_key {options.tls_key};",
            "        ssl_protocols TLSv1.2 TLSv1.3;",
            "        ssl_session_cache shared:omnigent_tls:10m;",
        ]
    lines += [
        "",
        "        # The largest body the server accepts (uploads, bundles, workspace writes).",
        f"        client_max_body_size {body_limit_mib()}m;",
        "        proxy_http_version 1.1;",
        f"        proxy_connect_timeout {CONNECT_TIMEOUT_S}s;",
        f"        proxy_read_timeout {options.read_timeout_s}s;",
        f"        proxy_send_timeout {options.read_timeout_s}s;",
        "        # A process that is restarting refuses connections: the request goes to",
        "        # the next one (nginx never retries a POST or PATCH that reached one).",
        "        proxy_next_upstream error http_502;",
        "        proxy_next_upstream_tries 3;",
        "        # Every proxy_set_header is here: nginx drops the server's headers in a",
        "        # location that sets any of its own.",
        "        proxy_set_header Host $host;",
        "        proxy_set_header Upgrade $http_upgrade;",
        "        proxy_set_header Connection $omnigent_connection;",
        "        # Set here, never passed on from the client: the server trusts these only",
        "        # from addresses in OMNIGENT_TRUSTED_PROXIES (this proxy's).",
        "        proxy_set_header X-Forwarded-For $remote_addr;",
        "        proxy_set_header X-Forwarded-Proto $scheme;",
        "        proxy_set_header X-Forwarded-Host $host;",
        "        proxy_set_header X-Request-ID $omnigent_request_id;",
    ]
    if identity:
        lines += [
            f"        # The identity header ({identity}): whatever the client sent is dropped.",
            "        # Behind an authenticating layer, set it from that layer's variable",
            f"        # instead, e.g. proxy_set_header {identity} $authenticated_user;",
            f'        proxy_set_header {identity} "";',
        ]
    lines += [
        "",
        "        # Runner tunnels: WebSocket, open for hours (the server pings every",
        "        # OMNIGENT_HEARTBEAT_S), never buffered.",
        "        location ~ ^/v1/runners/[^/]+/tunnel$ {",
        "            proxy_pass http://omnigent;",
        "            proxy_buffering off;",
        f"            proxy_read_timeout {options.long_read_timeout_s}s;",
        f"            proxy_send_timeout {options.long_read_timeout_s}s;",
        "        }",
        "",
        "        # Server-Sent Events: the session stream and the session-list stream,",
        "        # unbuffered, open for hours (a heartbeat every OMNIGENT_STREAM_HEARTBEAT_S).",
        "        location ~ ^/v1/sessions/(updates|[^/]+/stream)$ {",
        "            proxy_pass http://omnigent;",
        "            proxy_buffering off;",
        "            proxy_cache off;",
        f"            proxy_read_timeout {options.long_read_timeout_s}s;",
        "        }",
        "",
        "        # Health checks for the balancer's own monitoring (200 or 503 with details).",
        "        location = /health {",
        "            proxy_pass http://omnigent;",
        "            access_log off;",
        "        }",
        "",
        "        location / {",
        "            proxy_pass http://omnigent;",
        "        }",
        "    }",
        "}",
        "",
    ]
    return "\n".join(lines)


@dataclass
class SystemdOptions:
    upstreams: list[str]
    app_dir: str = "/srv/omnigent/app"
    python: str = "/srv/omnigent/venv/bin/python"
    user: str = "omnigent"
    env_file: str = "/etc/omnigent/omnigent.env"
    runner_command: str = "/srv/omnigent-runner/venv/bin/omnigent-runner"
    runner_server_url: str = "https://omnigent.example.com"
    runner_workspace: str = "/srv/workspace"
    runner_env_file: str = "/etc/omnigent/runner.env"
    runner_token_file: str = "/etc/omnigent/runner-token"


def render_systemd(options: SystemdOptions) -> dict[str, str]:
    """The units, by file name: ``omnigent@.service`` (one server process per port,
    ``omnigent@8001``…), ``omnigent-migrate.service`` (run before them),
    ``omnigent-webhooks.service`` (the webhook worker), ``omnigent.target`` (all of this
    machine's processes) and
    ``omnigent-runner.service`` (a runner, its token from a credentials file)."""
    upstreams = [parse_address(value, what="--upstream") for value in options.upstreams]
    if not upstreams:
        raise DeployConfigError("at least one --upstream HOST:PORT is needed")
    hosts = {host for host, _port in upstreams}
    if len(hosts) != 1:
        raise DeployConfigError(
            "--upstream addresses of one machine share a host; render each machine's "
            f"units apart (got {', '.join(sorted(hosts))})"
        )
    host = hosts.pop()
    python = shlex.quote(options.python)
    instances = " ".join(f"omnigent@{port}.service" for _host, port in upstreams)
    # The [Unit] lines and the start of [Service] of the long-running app processes.
    after_migrate = """\
Wants=network-online.target
After=network-online.target omnigent-migrate.service
Requires=omnigent-migrate.service
PartOf=omnigent.target
"""
    app_process = f"""\
Type=simple
User={options.user}
WorkingDirectory={options.app_dir}
EnvironmentFile={options.env_file}
# Every process of this machine writes its metrics here (GET /metrics sums them).
Environment=PROMETHEUS_MULTIPROC_DIR=/var/lib/omnigent/metrics
StateDirectory=omnigent omnigent/metrics"""
    server = f"""\
# One Omnigent server process per instance: omnigent@8001.service listens on port 8001.
# Rendered by: python manage.py deployconfig systemd (docs/deployment.md).
[Unit]
Description=Omnigent server process on port %i
{after_migrate}
[Service]
{app_process}
ExecStart={python} -m omnigent_site.serve --host {host} --port %i
# SIGTERM: open streams get [DONE], requests in flight a moment to finish, runner
# tunnels move to the other processes (a rolling restart: one instance at a time).
KillSignal=SIGTERM
TimeoutStopSec=20
Restart=on-failure
RestartSec=1
LimitNOFILE=65536
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full

[Install]
WantedBy=omnigent.target
"""
    migrate = f"""\
# Brings the database up to the release's migrations before the server processes start.
[Unit]
Description=Omnigent database migrations
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
User={options.user}
WorkingDirectory={options.app_dir}
EnvironmentFile={options.env_file}
ExecStart={python} manage.py migrate --noinput
"""
    webhooks = f"""\
# Sends webhook deliveries, so the server processes do not spend their CPU on it: set
# OMNIGENT_WEBHOOK_DELIVERY=worker in the environment file (docs/automation.md). Any
# number of machines may run one; each attempt is claimed by one of them.
[Unit]
Description=Omnigent webhook deliveries
{after_migrate}
[Service]
{app_process}
ExecStart={python} manage.py deliverwebhooks
# SIGTERM: the attempts in flight are recorded (up to a second); one cut short is sent
# again once its claim expires.
KillSignal=SIGTERM
TimeoutStopSec=20
Restart=on-failure
RestartSec=1
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full

[Install]
WantedBy=omnigent.target
"""
    target = f"""\
# All Omnigent server processes of this machine: systemctl start omnigent.target
[Unit]
Description=Omnigent server processes
Wants={instances} omnigent-webhooks.service

[Install]
WantedBy=multi-user.target
"""
    runner = f"""\
# An Omnigent runner: dials the server, works in its workspace, restarts on failure.
# The binding token is a systemd credential (a file only this unit reads).
[Unit]
Description=Omnigent runner
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User={options.user}
WorkingDirectory={options.runner_workspace}
# OPENAI_API_KEY, OPENAI_BASE_URL and the like (mode 0600).
EnvironmentFile=-{options.runner_env_file}
Environment=RUNNER_SERVER_URL={options.runner_server_url}
Environment=OMNIGENT_RUNNER_WORKSPACE={options.runner_workspace}
LoadCredential=binding-token:{options.runner_token_file}
Environment=OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN_FILE=%d/binding-token
ExecStart={shlex.quote(options.runner_command)}
Restart=on-failure
RestartSec=2
# Exit code 2 is a configuration error or a refused token: restarting cannot fix it.
RestartPreventExitStatus=2
NoNewPrivileges=yes

[Install]
WantedBy=multi-user.target
"""
    return {
        "omnigent@.service": server,
        "omnigent-migrate.service": migrate,
        "omnigent-webhooks.service": webhooks,
        "omnigent.target": target,
        "omnigent-runner.service": runner,
    }
