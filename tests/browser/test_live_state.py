"""The session page shows only what is true (issue 43, "It shows what is not true"): its
connection to the server (live / reconnecting), the runner's state as it changes
(``session.runner`` on the session stream), and errors cleared once their cause is gone.
Real chromium, daphne, runner and mock LLM, as in test_web_page.py."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    restart_on_same_port,
    start_runner,
)
from tests.browser.test_session_page_truth import open_session
from tests.browser.test_web_page import send

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def header(page: Any) -> dict[str, str]:
    return {
        "connection": page.get_attribute("#connection", "data-state") or "",
        "dot": page.get_attribute("#runner-dot", "data-online") or "",
        "runner": page.inner_text("#runner-label"),
        "stale": page.get_attribute("#status", "data-stale") or "",
    }


def test_runner_killed_and_server_killed_while_the_page_is_open(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    session_id = create_session(server, make_bundle(), title="live state")
    bind(server, session_id, runner.runner_id)
    context, page, _errors = open_session(browser, server, session_id)
    assert header(page) == {"connection": "live", "dot": "yes", "runner": "e2e online", "stale": ""}
    restarted: Runner | None = None
    again = server
    try:
        # The runner dies: its dot turns red without a reload, and a send says why.
        assert runner.process is not None
        runner.process.kill()
        page.wait_for_selector("#runner-dot[data-online=no]", timeout=10000)
        assert page.inner_text("#runner-label") == "e2e offline"
        send(page, "Anyone there?")
        page.wait_for_selector("#session-error:not([hidden])")
        # A reload while it is away: the workspace says it cannot be read.
        page.reload()
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("#ws-note:not([hidden])")
        assert page.get_attribute("#runner-dot", "data-online") == "no"
        send(page, "Still nobody?")
        page.wait_for_selector("#session-error:not([hidden])")
        # It comes back: green again, the send error and the workspace note are gone.
        restarted = start_runner(
            server=server, token=runner.token, runner_id=runner.runner_id,
            workspace=runner.workspace, log_dir=tmp_path, name="runner-again",
            extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        )  # fmt: skip
        page.wait_for_selector("#runner-dot[data-online=yes]", timeout=10000)
        page.wait_for_selector("#session-error", state="hidden", timeout=5000)
        page.wait_for_selector("#ws-note", state="hidden", timeout=5000)
        assert page.locator("#ws-tree > li").count() >= 0

        # The server dies: the page says it is reconnecting; no status or runner state
        # is claimed meanwhile, and a send says the server is out of reach.
        server.process.kill()
        page.wait_for_selector("#connection[data-state=reconnecting]", timeout=10000)
        assert header(page) == {
            "connection": "reconnecting",
            "dot": "unknown",
            "runner": "e2e: unknown while reconnecting",
            "stale": "1",
        }
        send(page, "Hello?")
        page.wait_for_selector("#session-error[data-code=network]")
        assert "Failed to fetch" not in page.inner_text("#session-error")
        # It comes back on the same port: live, the runner green once it has dialled in
        # again, the error gone.
        again = restart_on_same_port(server, tmp_path, "daphne-again", sig=signal.SIGKILL)
        page.wait_for_selector("#connection[data-state=live]", timeout=30000)
        page.wait_for_selector("#session-error", state="hidden", timeout=5000)
        page.wait_for_selector("#runner-dot[data-online=yes]", timeout=30000)
        assert header(page)["stale"] == ""
    finally:
        context.close()
        if restarted is not None and restarted.process is not None:
            restarted.process.stop()
        if again is not server:
            again.process.stop()
