"""The session page shows a turn waiting for a runner slot with its place (usage.md,
Fair share), and drops the note once the turn starts. Real chromium, daphne, the runner
program with one slot and the mock LLM answering slowly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message, wait_until
from tests.browser.test_session_page_truth import open_session

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_waiting_message_shows_its_place_until_its_turn_starts(
    browser: Any,
    server: Server,
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    runner = launch_runner(server, env={"OMNIGENT_RUNNER_MAX_TURNS": "1"})
    mock_llm.configure([{"text": "slow answer", "delay_s": 4}], match="slow")
    busy, waiting = (create_session(server, make_bundle()) for _ in range(2))
    for session_id in (busy, waiting):
        bind(server, session_id, runner.runner_id)
    assert send_message(server, busy, "slow please").status_code == 202
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the slow turn to reach the LLM")
    assert send_message(server, waiting, "my turn?").status_code == 202

    context, page, errors = open_session(browser, server, waiting)
    try:
        note = page.locator("#transcript .entry.user .queue-place")
        note.wait_for(timeout=10_000)
        assert note.inner_text() == "waiting for a runner: next"
        # The slow turn ends, this one starts: the note goes (session.queue, live).
        note.wait_for(state="detached", timeout=30_000)
        page.wait_for_selector("#transcript .entry.assistant", timeout=30_000)
        assert errors == []
    finally:
        context.close()
