"""``manage.py deployconfig nginx|systemd …``: the deployment's configuration files for
given addresses (omnigent_site/deploy.py; docs/deployment.md). ``nginx`` prints one
``nginx.conf`` that ``nginx -t -c FILE -p DIR`` accepts; ``systemd`` prints the units,
each after a ``# --- <file name> ---`` line, or writes them into ``--output DIR``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from omnigent_site.deploy import (
    DeployConfigError,
    NginxOptions,
    SystemdOptions,
    render_nginx,
    render_systemd,
)


class Command(BaseCommand):
    help = "Print the nginx configuration or the systemd units for the given addresses."

    def add_arguments(self, parser: CommandParser) -> None:
        kinds = parser.add_subparsers(dest="kind", required=True)
        nginx = kinds.add_parser("nginx", help="a complete nginx.conf")
        nginx.add_argument("--listen", required=True, metavar="HOST:PORT")
        nginx.add_argument(
            "--upstream", action="append", required=True, metavar="HOST:PORT", dest="upstreams"
        )
        nginx.add_argument("--server-name", default="_", metavar="NAME")
        nginx.add_argument("--tls-cert", metavar="FILE")
        nginx.add_argument("--tls-key", metavar="FILE")
        nginx.add_argument(
            "--prefix", metavar="DIR", help="pid, logs and temporary files here (default: nginx's)"
        )
        systemd = kinds.add_parser("systemd", help="systemd units for servers and a runner")
        systemd.add_argument(
            "--upstream", action="append", required=True, metavar="HOST:PORT", dest="upstreams"
        )
        defaults = SystemdOptions(upstreams=[])
        for name in (
            "app_dir",
            "python",
            "user",
            "env_file",
            "runner_command",
            "runner_server_url",
            "runner_workspace",
            "runner_env_file",
            "runner_token_file",
        ):
            systemd.add_argument(
                "--" + name.replace("_", "-"),
                default=getattr(defaults, name),
                help=f"default: {getattr(defaults, name)}",
            )
        systemd.add_argument("--output", metavar="DIR", help="write the unit files here")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["kind"] == "nginx":
                self.stdout.write(
                    render_nginx(
                        NginxOptions(
                            listen=options["listen"],
                            upstreams=options["upstreams"],
                            server_name=options["server_name"],
                            tls_cert=options["tls_cert"],
                            tls_key=options["tls_key"],
                            prefix=options["prefix"],
                        )
                    ),
                    ending="",
                )
                return
            fields = {
                name: options[name]
                for name in SystemdOptions.__dataclass_fields__
                if name != "upstreams"
            }
            units = render_systemd(SystemdOptions(upstreams=options["upstreams"], **fields))
        except DeployConfigError as exc:
            raise CommandError(str(exc)) from None
        if options["output"]:
            folder = Path(options["output"])
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in units.items():
                (folder / name).write_text(text)
                self.stdout.write(str(folder / name))
            return
        for name, text in units.items():
            self.stdout.write(f"# --- {name} ---\n{text}", ending="\n")
