"""``python -m omnigent_runner``: the runner program's entry point.

Reads the configuration, builds the agent executor, and keeps the tunnel up until a
signal, the parent process's exit, or a fatal refusal from the server. Configuration
problems exit with code 2 before anything is dialled; nothing printed or logged here
ever contains the binding token.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from omnigent_runner import PROTOCOL_VERSION, RUNNER_VERSION, logs
from omnigent_runner.config import ConfigError, RunnerConfig, load_config, program_name
from omnigent_runner.executor import SessionExecutor
from omnigent_runner.logs import log_format_from
from omnigent_runner.tunnel import EXIT_FATAL, RunnerTunnel

logger = logging.getLogger("omnigent_runner")

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# The HTTP clients under the openai SDK (httpx2, the SDK's own; httpx) log one line per
# request at INFO: every LLM call, ``HTTP Request: POST …/v1/responses``.
_PER_REQUEST_LOGGERS = ("httpx2", "httpx")


def set_log_levels(level: str) -> None:
    """``level`` for the runner; the HTTP clients' line per request only at DEBUG."""
    logging.getLogger().setLevel(level)
    for name in _PER_REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def build_executor(config: RunnerConfig) -> SessionExecutor:
    """The agent executor, imported here so a config error never pays for (or trips on) it."""
    from omnigent_runner.agent import AgentExecutor

    return AgentExecutor(
        workspace=config.workspace,
        isolate_sessions=config.isolate_session,
        delta_interval_s=config.delta_interval_ms / 1000,
        llm_http_client=config.llm_http_client,
    )


def detect_vcs(workspace: Path) -> str:
    """``"git"`` if the workspace or one of its ancestors holds ``.git``, else ``"none"``."""
    for directory in (workspace, *workspace.parents):
        if (directory / ".git").exists():
            return "git"
    return "none"


def _install_signal_handlers(loop: asyncio.AbstractEventLoop, tunnel: RunnerTunnel) -> None:
    """Turn SIGTERM/SIGINT into a clean stop (close 1000, executor shutdown, exit 0)."""
    pending: set[asyncio.Task[None]] = set()

    def on_signal(signum: int) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        task = loop.create_task(tunnel.stop())
        pending.add(task)  # keep a reference until it finishes
        task.add_done_callback(pending.discard)

    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except (NotImplementedError, RuntimeError):  # e.g. not the main thread
            logger.debug("cannot install a handler for %s", signum)


def freeze_startup_objects() -> int:
    """Keep what was loaded at startup out of the garbage collector's full passes.

    The ``openai`` SDK with its pydantic models, httpx and aiohttp leave tens of
    thousands of objects that live as long as the runner, and every full collection
    walked them all while a turn's tokens were streaming
    (``docs/performance-history.md``, stage 9). The server does the same
    (``omnigent_site/runtime/server.py``). Returns how many objects are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def _serve(config: RunnerConfig) -> int:
    # Built inside the loop, so the executor may create tasks or loop-bound objects.
    executor = build_executor(config)
    freeze_startup_objects()  # after the executor's imports (the LLM client's above all)
    tunnel = RunnerTunnel(
        config,
        executor,
        workspace_info={"root": str(config.workspace), "vcs": detect_vcs(config.workspace)},
        capabilities={"isolate_sessions": config.isolate_session},
    )
    _install_signal_handlers(asyncio.get_running_loop(), tunnel)
    return await tunnel.run()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the runner; return the process exit code."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT, stream=sys.stderr)
    if log_format_from(os.environ) == "json":  # configuration errors print as usual
        logs.configure(log_format="json")
    try:
        config = load_config(
            list(argv) if argv is not None else None, os.environ, prog=program_name(sys.argv[0])
        )
    except ConfigError as exc:
        print(f"runner: configuration error: {exc}", file=sys.stderr)
        return EXIT_FATAL
    logs.configure(log_format=config.log_format, runner_id=config.runner_id)
    set_log_levels(config.log_level)

    logger.info(
        "runner %s (version %s, protocol %d) for server %s, workspace %s",
        config.runner_id,
        RUNNER_VERSION,
        PROTOCOL_VERSION,
        config.server_url,
        config.workspace,
    )
    try:
        return asyncio.run(_serve(config))
    except KeyboardInterrupt:  # a second Ctrl-C before the handlers were installed
        return 130


if __name__ == "__main__":
    sys.exit(main())
