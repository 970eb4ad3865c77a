"""Forced tunnel drops, the long run: turns through a proxy that cuts the runner's tunnel
200 times (RST, FIN, one-way black holes, cuts during the resend) at random points, then
the stored items and the stream replayed from the start compared with what the mock LLM
scripted (``testing/tunnel_drops.py``; the CI version is ``tests/e2e/test_tunnel_drops.py``).

Prints progress lines, then one JSON object: drops by kind, turns, completed, lost,
duplicated, tunnel connections, seconds. Exits 1 when anything was lost, duplicated or
left unfinished.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from bench._common import final_json, log_dir, run_main, sigterm_as_interrupt
from omnigent_runner.bundles import build_bundle
from testing.chaos_proxy import ChaosProxy
from testing.mockllm import MockLLMServer
from testing.processes import (
    Server,
    base_env,
    bind,
    create_session,
    migrate,
    register_runner,
    start_runner,
    start_server,
)
from testing.tunnel_drops import (
    OS_ENV,
    SEED,
    SERVER_SETTINGS,
    resends,
    run_turns,
    verify,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drops", type=int, default=200, help="drops to force (200)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed ({SEED})")
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs folder")
    args = parser.parse_args()
    sigterm_as_interrupt()
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        env = base_env(
            DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
            OMNIGENT_DATA_DIR=str(tmp / "data"),
            OMNIGENT_LOG_LEVEL="INFO",
            **SERVER_SETTINGS,
        )
        migrate(env, tmp)
        server: Server = start_server(env=env, log_dir=tmp, name="daphne", stack=stack)
        mock_llm = MockLLMServer()
        mock_llm.start()
        stack.callback(mock_llm.stop)
        proxy = ChaosProxy(int(server.url.rsplit(":", 1)[1])).start()
        stack.callback(proxy.stop)
        runner_id, token = register_runner(server)
        workspace = tmp / "workspace"
        workspace.mkdir()
        front = Server(url=proxy.url, process=server.process, env=server.env)
        runner = start_runner(
            server=front,
            token=token,
            runner_id=runner_id,
            workspace=workspace,
            log_dir=tmp,
            extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        )
        assert runner.process is not None
        stack.callback(runner.process.stop)
        spec = "name: drops\nprompt: Answer.\nexecutor:\n  model: mock-model\n" + OS_ENV
        session_id = create_session(server, build_bundle({"agent.yaml": spec}))
        bind(server, session_id, runner_id)
        turns, report = run_turns(
            server=server,
            proxy=proxy,
            mock_llm=mock_llm,
            session_id=session_id,
            runner_id=runner_id,
            drops=args.drops,
            seed=args.seed,
            log=lambda line: print(line, flush=True),
        )
        verify(server, session_id, turns, report)
        resent = resends(runner.process.log())
        final_json(
            {
                "seed": args.seed,
                **report.as_dict(),
                "reconnects_resending": sum(1 for count in resent if count > 0),
                "events_resent": sum(resent),
            }
        )
        ok = (
            not report.lost
            and not report.duplicated
            and not report.problems
            and report.completed == report.turns
            and report.unnoticed_black_holes == 0
        )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
