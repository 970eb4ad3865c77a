"""Forced tunnel drops (issue 15): turns through a proxy that cuts the runner's tunnel
at random points, then the stored items and the stream replayed from the start are
compared with what the mock LLM scripted. ``bench/tunnel_drops.py`` runs 200 drops."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.chaos_proxy import DROP_KINDS, ChaosProxy
from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session
from testing.tunnel_drops import OS_ENV, SEED, SERVER_SETTINGS, resends, run_turns, verify

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DROPS = 50


def test_fifty_drops_lose_and_repeat_nothing(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(**SERVER_SETTINGS)
    proxy = ChaosProxy(int(server.url.rsplit(":", 1)[1])).start()
    try:
        runner = launch_runner(server, via_url=proxy.url)
        session_id = create_session(server, make_bundle(extra=OS_ENV))
        bind(server, session_id, runner.runner_id)
        turns, report = run_turns(
            server=server,
            proxy=proxy,
            mock_llm=mock_llm,
            session_id=session_id,
            runner_id=runner.runner_id,
            drops=DROPS,
            seed=SEED,
        )
        verify(server, session_id, turns, report)
    finally:
        proxy.stop()
    print(report.as_dict())
    assert report.drops >= DROPS
    assert set(report.drops_by_kind) == set(DROP_KINDS), report.drops_by_kind
    assert report.unnoticed_black_holes == 0, "a black hole went unnoticed"
    assert report.completed == report.turns, report.problems
    assert report.lost == [], report.lost
    assert report.duplicated == [], report.duplicated
    assert report.problems == []
    # Every drop made the runner dial again, and some reconnects resent events the
    # server had not acknowledged (the at-least-once path, with its dedupe, was taken).
    assert report.reconnects > DROPS
    assert runner.process is not None
    resent = resends(runner.process.log())
    assert sum(1 for count in resent if count > 0) >= 3, resent
