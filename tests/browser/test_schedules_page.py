"""The Schedules page in a real browser against a real daphne and runner: the preview
shows the next five times in the chosen zone and follows the rule, a task is created,
"Run now" starts a run whose session the model answers, and the history links to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ALICE = "alice@example.com"


def test_create_preview_run_now_and_history(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    with server.client(ALICE) as client:
        client.post(
            "/v1/agents",
            files={"bundle": ("a.tar.gz", make_bundle("nightly-agent"), "application/gzip")},
        ).raise_for_status()
    mock_llm.configure([{"text": "Report done."}])
    context = browser.new_context(
        viewport={"width": 1200, "height": 900},
        extra_http_headers={"X-Forwarded-Email": ALICE},
        timezone_id="Europe/Paris",
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/schedules")
    page.wait_for_selector("#sched-agent option", state="attached")
    assert page.input_value("#sched-zone") == "Europe/Paris"

    # The preview: five times, in the zone, following the rule as it is typed.
    page.wait_for_function("() => document.querySelectorAll('#sched-preview li').length === 5")
    first = page.get_attribute("#sched-preview li time", "datetime") or ""
    assert first.endswith(("+01:00", "+02:00")) and "T02:00:00" in first
    page.fill("#sched-rrule", "FREQ=MINUTELY")
    page.wait_for_selector("#preview-error:not([hidden])")
    assert "5 minutes" in page.inner_text("#preview-error")
    page.fill("#sched-zone", "America/New_York")
    page.fill("#sched-rrule", "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=30")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#sched-preview li time')].length === 5 && "
        "[...document.querySelectorAll('#sched-preview li time')]"
        ".every(t => t.dateTime.includes('T09:30:00-0'))"
    )

    page.fill("#sched-name", "Monday report")
    page.fill("#sched-prompt", "Write the weekly report")
    page.click("#schedule-form button[type=submit]")
    row = page.wait_for_selector("#schedule-rows tr")
    assert "Monday report" in row.inner_text()
    assert page.is_checked("#schedule-rows input[type=checkbox]")

    page.click("#schedule-rows button:has-text('Run now')")
    link = page.wait_for_selector("#history-rows a")
    assert "running" in page.inner_text("#history-rows") or "completed" in page.inner_text(
        "#history-rows"
    )
    link.click()
    page.wait_for_url("**/s/conv_*")
    page.wait_for_function("() => document.body.innerText.includes('Report done.')", timeout=30_000)

    page.goto(f"{server.url}/schedules")
    page.wait_for_selector("#schedule-rows tr")
    page.uncheck("#schedule-rows input[type=checkbox]")
    page.wait_for_function(
        "() => document.querySelector('#schedule-rows tr td:nth-child(3)').innerText.trim() === '—'"
    )
    # The refused preview's 400 is logged by the browser as a failed resource load.
    assert [error for error in errors if "status of 400" not in error] == []
