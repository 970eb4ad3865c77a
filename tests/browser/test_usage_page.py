"""Usage on the web page in a real browser against a real daphne, runner and the mock
LLM (docs/usage.md): tokens and cost under each answer, the session's total in its
header (live, from ``session.usage``), and the Usage page's chart and tables.

``OMNIGENT_SCREENSHOTS=1`` writes docs/images/web-usage.png.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import REPO, Runner, Server, bind, create_session, send_message, wait_turn
from tests.e2e.conftest import server_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ALICE = "alice@example.com"
IMAGES = REPO / "docs" / "images"
SHOOT = os.environ.get("OMNIGENT_SCREENSHOTS") == "1"
PRICES = "mock-model:\n  input_per_million: 2.0\n  output_per_million: 8.0\n"
# 2000 × 2 + 500 × 8 = 8000 µUSD a call: $0.0080.
CALL = {"input_tokens": 2000, "output_tokens": 500}
# Past days of spend for the chart: (days ago, model, agent, cost in nano-dollars).
HISTORY = [
    (days, model, agent, (days % 7 + 1) * scale)
    for days in range(1, 30)
    for model, agent, scale in (
        ("gpt-4.1", "reviewer", 90_000_000),
        ("gpt-4o-mini", "file-helper", 12_000_000),
    )
]


@pytest.fixture
def price_table() -> str:
    """This page's prices for the shared ``priced_server``."""
    return PRICES


def seed_history(tmp_path: Path) -> None:
    """Earlier days' totals, as recorded calls leave them, for Alice."""
    code = (
        "import datetime as d\n"
        "from django.contrib.auth.models import User\n"
        "from usage.models import DailyUsage, MonthlyUsage\n"
        f"u = User.objects.get_or_create(username={ALICE!r})[0]\n"
        "today = d.datetime.now(d.UTC).date()\n"
        f"for days, model, agent, cost in {HISTORY!r}:\n"
        "    DailyUsage.objects.create(user_id=u.pk, day=today - d.timedelta(days=days),"
        " model=model, agent_name=agent, input_tokens=cost // 1000, output_tokens=cost // 4000,"
        " llm_calls=3, priced_calls=3, cost_nano=cost)\n"
        "    m = MonthlyUsage.objects.get_or_create(user_id=u.pk,"
        " month=(today - d.timedelta(days=days)).replace(day=1), model=model, agent_name=agent)[0]\n"
        "    m.input_tokens += cost // 1000; m.output_tokens += cost // 4000; m.llm_calls += 3\n"
        "    m.priced_calls += 3; m.cost_nano += cost; m.save()\n"
    )
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO, env={**os.environ, **server_env(tmp_path)}, check=True, capture_output=True,
        timeout=120,
    )  # fmt: skip


def ask_budget(tmp_path: Path, session_id: str, response_id: str) -> None:
    """A budget question on the turn, as the runner's ``approval.requested`` stores it."""
    code = (
        "from omnigent_runner import protocol\n"
        "from sessions import approvals\n"
        "from sessions.models import Session, Turn\n"
        f"s = Session.objects.get(pk={session_id!r})\n"
        f"t = Turn.objects.get(session=s, id={response_id!r})\n"
        "e = protocol.ApprovalRequested(response_id=t.id, call_id='budget_1', tool='', phase='budget',"
        " arguments={'kind': 'budget', 'scope': 'session', 'budget_usd': 2.5,"
        " 'spent_usd': 2.5123, 'increment_usd': 1.0}, policy_name='budget',"
        " reason='budget spent', ask_timeout=600.0)\n"
        "approvals.record_requested(session=s, turn=t, event=e)\n"
    )
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO, env={**os.environ, **server_env(tmp_path)}, check=True, capture_output=True,
        timeout=120,
    )  # fmt: skip


def test_usage_under_answers_in_the_header_and_on_the_usage_page(
    browser: Any,
    priced_server: Server,
    launch_runner: Callable[..., Runner],
    workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    server = priced_server
    runner = launch_runner(server, workspace=workspace)
    mock_llm.configure(
        [{"text": "First answer.", "usage": CALL}, {"text": "Second answer.", "usage": CALL}]
    )
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    sent = send_message(server, session_id, "hello")
    assert wait_turn(server, session_id, sent.json()["response_id"])["status"] == "completed"

    context = browser.new_context(
        viewport={"width": 1200, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/s/{session_id}")
    line = page.wait_for_selector("li.usage-line")
    assert line.inner_text() == "2,500 tokens · $0.0080 · 1 model call"
    assert page.inner_text("#cost") == "2,500 tokens · $0.0080"

    # A turn sent from the page: its line appears and the header follows, live.
    page.fill("#message", "again")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('li.usage-line').length === 2")
    page.wait_for_function(
        "() => document.getElementById('cost').innerText === '5,000 tokens · $0.0160'"
    )
    # A budget shows next to the cost (docs/usage.md, Budgets).
    with server.client(ALICE) as client:
        patched = client.patch(f"/v1/sessions/{session_id}", json={"budget_usd": 2.5})
    assert patched.status_code == 200, patched.text
    ask_budget(tmp_path, session_id, sent.json()["response_id"])
    page.reload()
    page.wait_for_function(
        "() => document.getElementById('cost').innerText === '5,000 tokens · $0.0160 of $2.50'"
    )
    # A budget question's card: its sentence, no call arguments, "Allow more".
    card = page.wait_for_selector("#approvals li.approval.budget")
    assert card.query_selector(".approval-message").inner_text() == (
        "Budget reached: spent $2.5123 of $2.50 (the session's budget) — allow $1.00 more?"
    )
    assert card.query_selector("pre.call-args") is None
    assert card.query_selector("button.approve").inner_text() == "Allow more"

    seed_history(tmp_path)
    page.click("nav a:has-text('Usage')")
    page.wait_for_url("**/usage")
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("#cost-today") == "$0.0160"
    bars = page.query_selector_all("#usage-chart rect.bar")
    assert len(bars) == 30
    assert bars[-1].get_attribute("data-cost") == "0.016"
    models = page.inner_text("#by-model tbody")
    assert "mock-model" in models and "gpt-4.1" in models and "$0.0160" in models
    agents = page.inner_text("#by-agent tbody")
    assert "reviewer" in agents and "file-helper" in agents
    if SHOOT:
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / "web-usage.png"), full_page=True)
    page.select_option("#usage-range", "7")
    page.wait_for_function("() => document.querySelectorAll('#usage-chart rect.bar').length === 7")
    assert errors == []
