"""The web page in a real browser (Debian's chromium through Playwright) against a real
daphne, a real runner and the mock LLM (shared/spec/web.md).

The screenshots in docs/images/ are taken here (``OMNIGENT_SCREENSHOTS=1`` writes them;
web-usage.png in test_usage_page.py);
the pictures of a conversation come from an ordinary one, never from the tests that put
hostile text on the page.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import REPO, Runner, Server, bind, create_session, wait_until
from tests.e2e.conftest import server_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE = "alice@example.com"
BOB = "bob@example.com"
PASSWORD = "pw-for-the-web-test"
XSS = '<img src=x onerror="document.body.dataset.pwned=1">'
IMAGES = REPO / "docs" / "images"
# The agent works in the runner's workspace folder (agents.md, os_env).
OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
SHOOT = os.environ.get("OMNIGENT_SCREENSHOTS") == "1"


def set_password(tmp_path: Path, username: str) -> None:
    """Give the (maybe header-created) Django user a password, so it can sign in."""
    code = (
        "from django.contrib.auth.models import User;"
        f"u = User.objects.get_or_create(username={username!r})[0];"
        f"u.set_password({PASSWORD!r}); u.save()"
    )
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO, env={**os.environ, **server_env(tmp_path)}, check=True, capture_output=True,
        timeout=120,
    )  # fmt: skip


def shot(page: Any, name: str) -> None:
    if SHOOT:
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"{name}.png"))


def sign_in(page: Any, server: Server, username: str) -> None:
    page.goto(f"{server.url}/")
    page.wait_for_url("**/signin?next=*")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    shot(page, "web-signin")
    page.click("button[type=submit]")
    page.wait_for_selector("#session-list")


def transcript_texts(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#transcript .bubble", "ns => ns.map(n => n.innerText)"))


def send(page: Any, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


def test_sign_in_create_chat_diff_stop_share_and_live_list(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    set_password(tmp_path, ALICE)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    # Sign in; the list is live: a session created elsewhere appears without a reload.
    sign_in(page, server, ALICE)
    assert page.inner_text("#user-name") == ALICE
    page.wait_for_selector("#live[data-state=live]")
    other = create_session(server, make_bundle("list-agent"), title=XSS)
    row = page.wait_for_selector(f"li.session-row[data-id='{other}']")
    assert XSS in row.inner_text()  # a title is text, never markup
    assert page.locator("li.session-row img").count() == 0

    # Another tab creates a session from a bundle file, bound to the online runner, and
    # opens its page; the first tab's list shows it without a reload.
    list_page = page
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/")
    bundle = tmp_path / "helper.tar.gz"
    bundle.write_bytes(make_bundle("file-helper", extra=OS_ENV))
    page.click("#new-session")
    page.wait_for_selector("#runner option[value^=runner_token_]", state="attached")
    page.set_input_files("#bundle", str(bundle))
    page.fill("#title", "Write a greeting")
    page.select_option("#runner", runner.runner_id)
    page.click("#create")
    page.wait_for_url("**/s/conv_*")
    session_id = page.url.rsplit("/", 1)[1]
    created_row = list_page.wait_for_selector(f"li.session-row[data-id='{session_id}']")
    assert "Write a greeting" in created_row.inner_text()
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("#title") == "Write a greeting"
    assert page.inner_text("#runner-label") == "e2e online"

    # A turn that edits a file, then answers in streamed Markdown with an XSS payload.
    mock_llm.configure(
        [
            {"tool_calls": [{"name": "sys_os_write",
                             "arguments": {"path": "hello.txt", "content": "Hello!\nBye.\n"}}]},
            {"text": f"I wrote **hello.txt** for you. {XSS} done", "stream": True},
        ]
    )  # fmt: skip
    send(page, "Write hello.txt")
    page.wait_for_selector("#transcript .entry.tool[data-call-id]")
    page.wait_for_function(
        "() => document.querySelector('#transcript .entry.assistant .bubble strong')"
        "?.textContent === 'hello.txt'"
    )
    page.wait_for_selector("#status[data-status=idle]")
    answer = page.locator("#transcript .entry.assistant .bubble").last
    assert XSS in answer.inner_text()
    assert page.locator("#transcript img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    assert transcript_texts(page)[0] == "Write hello.txt"
    # The tool card opens to its arguments and output.
    page.click("#transcript .entry.tool summary")
    assert "hello.txt" in page.inner_text("#transcript .entry.tool .call-args")
    assert page.inner_text("#transcript .entry.tool .call-status") == "completed"

    # The change set and a coloured diff with line numbers.
    change = page.wait_for_selector("#changes li[data-path='hello.txt']")
    assert "+2" in change.inner_text()
    change.query_selector("button").click()
    page.wait_for_selector("#diff tr.add")
    added = page.eval_on_selector_all("#diff tr.add td.code", "ns => ns.map(n => n.textContent)")
    assert added == ["+Hello!", "+Bye."]

    # A dropped stream resumes from the last event id: nothing missing, nothing twice.
    mock_llm.configure([{"text": "alpha beta gamma delta", "stream": True, "delay_s": 1.0}])
    send(page, "Count for me")
    page.wait_for_selector("#status[data-status=running]")
    page.evaluate("window.omnigentSession.stream.drop()")
    page.wait_for_selector("#status[data-status=idle]")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .bubble')]"
        ".some(n => n.innerText.includes('alpha beta gamma delta'))"
    )
    texts = transcript_texts(page)
    assert texts.count("Count for me") == 1, texts
    assert sum("alpha beta gamma delta" in text for text in texts) == 1, texts
    assert page.evaluate("window.omnigentSession.stream.lastId") > 0

    # Stop a long turn.
    mock_llm.configure([{"text": "too slow", "delay_s": 30}])
    send(page, "Think for a long time")
    page.wait_for_selector("#stop:not([hidden])")
    page.click("#stop")
    page.wait_for_selector("#status[data-status=idle]", timeout=20000)
    assert page.is_hidden("#stop")
    assert not any("too slow" in text for text in transcript_texts(page))

    # Share read access with Bob, who then sees it read-only.
    page.click("#share")
    page.fill("#grant-user", BOB)
    page.select_option("#grant-level", "1")
    page.click("#grant-form button[type=submit]")
    page.wait_for_selector(f"#grants tr[data-user='{BOB}']")
    page.keyboard.press("Escape")
    bob = browser.new_context(
        viewport={"width": 390, "height": 844}, extra_http_headers={"X-Forwarded-Email": BOB}
    )
    bob_page = bob.new_page()
    bob_page.goto(f"{server.url}/s/{session_id}")
    bob_page.wait_for_selector("body[data-ready='1']")
    assert bob_page.is_hidden("#composer") and bob_page.is_hidden("#share")
    assert "Write hello.txt" in transcript_texts(bob_page)
    assert bob_page.evaluate("document.documentElement.scrollWidth") <= 390
    bob.close()

    page.goto(f"{server.url}/")
    page.wait_for_selector(f"li.session-row[data-id='{session_id}']")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    assert errors == [], errors
    context.close()


README_CONTENT = (
    "# Notes\n\n"
    "Meeting notes, one file per week, named by its Monday (2026-11-30.md).\n"
    "Decisions go at the top of each file.\n"
)
ANSWER = (
    "I added **notes/README.md**. It says:\n\n"
    "- what the folder holds: one file of meeting notes per week\n"
    "- how the files are named (`2026-11-30.md`)\n"
    "- that decisions go at the top\n\n"
    "Shall I add a template for a new week too?"
)


def test_an_ordinary_conversation_for_the_pictures(
    browser: Any,
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """A conversation as people have them: a request, a file written, an answer in
    Markdown with a list and inline code, its cost against the session's budget; the
    session, the list (one session pinned) and the read-only phone view as the README
    and docs/web.md show them."""
    server, runner = priced_server, priced_runner
    for title in ("Summarise last week's meeting notes", "Fix the failing date parser test"):
        other = create_session(server, make_bundle("file-helper", extra=OS_ENV), title=title)
    with server.client() as client:  # pinned: the sidebar shows it first, under "Pinned"
        assert client.put(f"/v1/sessions/{other}/pin").json()["pinned"] is True
    session_id = create_session(
        server, make_bundle("file-helper", extra=OS_ENV), title="A README for the notes folder"
    )
    bind(server, session_id, runner.runner_id)
    with server.client() as client:
        budgeted = client.patch(f"/v1/sessions/{session_id}", json={"budget_usd": 2.5})
        assert budgeted.status_code == 200, budgeted.text
    notes = runner.workspace / "notes"
    notes.mkdir()
    (notes / "2026-11-30.md").write_text("# Week of 30 November\n")
    mock_llm.configure(
        [
            {"tool_calls": [{"name": "sys_os_write",
                             "arguments": {"path": "notes/README.md", "content": README_CONTENT}}]},
            {"text": ANSWER, "stream": True},
        ]
    )  # fmt: skip
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    send(page, "Add a short README to the notes folder that says what the folder is for.")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .entry.assistant .bubble')]"
        ".some(n => n.innerText.includes('template for a new week'))"
    )
    page.wait_for_selector("#status[data-status=idle]")
    assert page.locator("#transcript .entry.assistant .bubble li").count() == 3
    answer = page.locator("#transcript .entry.assistant .bubble").last
    assert answer.locator("strong").inner_text() == "notes/README.md"
    assert answer.locator("code").inner_text() == "2026-11-30.md"
    page.click("#transcript .entry.tool summary")
    assert "notes/README.md" in page.inner_text("#transcript .entry.tool .call-args")
    change = page.wait_for_selector("#changes li[data-path='notes/README.md']")
    assert "+4" in change.inner_text()
    change.query_selector("button").click()
    page.wait_for_selector("#diff tr.add")
    added = page.eval_on_selector_all("#diff tr.add td.code", "ns => ns.map(n => n.textContent)")
    assert added == ["+" + line for line in README_CONTENT.splitlines()]
    page.wait_for_selector(f"#side-list li.side-row[data-id='{other}'][data-pinned='1']")
    # The header's cost is priced and set against the budget (docs/usage.md).
    page.wait_for_function(
        "() => /\\$0\\.\\d+ of \\$2\\.50$/.test(document.getElementById('cost').innerText)"
    )
    shot(page, "web-session")

    page.goto(f"{server.url}/")
    page.wait_for_selector(f"li.session-row[data-id='{session_id}']")
    assert page.locator("li.session-row").count() == 3
    pinned_rows = page.eval_on_selector_all(
        "li.session-row:has(.pinned-mark)", "ns => ns.map(n => n.dataset.id)"
    )
    assert pinned_rows == [other]  # the picture shows the marker
    shot(page, "web-sessions")

    with server.client() as client:
        granted = client.put(
            f"/v1/sessions/{session_id}/permissions", json={"user_id": BOB, "level": 1}
        )
        assert granted.status_code == 200, granted.text
    bob = browser.new_context(
        viewport={"width": 390, "height": 844}, extra_http_headers={"X-Forwarded-Email": BOB}
    )
    bob_page = bob.new_page()
    bob_page.goto(f"{server.url}/s/{session_id}")
    bob_page.wait_for_selector("body[data-ready='1']")
    bob_page.wait_for_selector("#transcript .entry.assistant .bubble li")
    assert bob_page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(bob_page, "web-session-phone")
    bob.close()
    context.close()
    assert errors == [], errors


def test_a_500_item_session_is_interactive_in_under_a_second(
    browser: Any, server: Server, make_bundle: Callable[..., bytes]
) -> None:
    with server.client() as client:
        agent = client.post(
            "/v1/agents", files={"bundle": ("a.tar.gz", make_bundle("big"), "application/gzip")}
        ).json()["id"]
        items = []
        for index in range(250):
            items.append({"type": "message", "role": "user", "content": f"question {index}"})
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": f"Answer **{index}** with `code` and a list:\n\n- one\n- two\n",
                }
            )
        created = client.post(
            "/v1/sessions",
            json={"agent_id": agent, "title": "Long session", "initial_items": items},
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    timings = []
    for _ in range(2):  # the first load also warms the server; both are reported
        page.goto(f"{server.url}/s/{session_id}")
        page.wait_for_selector("body[data-ready='1']")
        page.click("#message")  # interactive: the composer takes input
        page.keyboard.type("x")
        timings.append(
            page.evaluate("performance.getEntriesByName('omnigent-session-ready')[0].startTime")
        )
    assert page.locator("#transcript > li").count() == 500
    print(f"\n500-item session page ready after {[round(t) for t in timings]} ms")
    assert min(timings) < 1000, timings
    context.close()


def test_the_page_follows_a_server_restart_mid_turn_without_duplicates(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    """Kill daphne while a turn waits on the LLM, start it again on the same port: the
    page reconnects with its last event id and shows the answer once."""
    session_id = create_session(server, make_bundle(), title="restart")
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(extra_http_headers={"X-Forwarded-Email": ALICE})
    page = context.new_page()
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    mock_llm.configure([{"text": "survived the restart", "stream": True, "delay_s": 4}])
    send(page, "Keep going")
    page.wait_for_selector("#status[data-status=running]")
    wait_until(lambda: mock_llm.requests, deadline_s=30, what="the turn to reach the LLM")
    server.process.kill()
    page.wait_for_selector("#session[data-stream=reconnecting]")
    port = server.url.rsplit(":", 1)[1]
    restarted = subprocess.Popen(
        [sys.executable, "-m", "omnigent_site.serve", "--host", "127.0.0.1", "--port", port],
        cwd=REPO, env=server.env, stdout=(tmp_path / "daphne-again.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        page.wait_for_selector("#session[data-stream=live]", timeout=30000)
        page.wait_for_function(
            "() => [...document.querySelectorAll('#transcript .bubble')]"
            ".some(n => n.innerText.includes('survived the restart'))",
            timeout=60000,
        )
        time.sleep(0.5)  # let any late duplicate arrive before counting
        texts = transcript_texts(page)
        assert texts.count("Keep going") == 1, texts
        assert sum("survived the restart" in text for text in texts) == 1, texts
    finally:
        context.close()
        restarted.terminate()
        restarted.wait(timeout=15)


def test_an_answer_cut_off_mid_stream_stays_on_the_page_marked_incomplete(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """Issue 44: the LLM's connection breaks mid-answer. The text already shown stays,
    marked incomplete, next to the error; a reload (the stored transcript) shows the
    same, so what people saw live and what is kept agree."""
    session_id = create_session(server, make_bundle(), title="cut off")
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(extra_http_headers={"X-Forwarded-Email": ALICE})
    page = context.new_page()
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")
    mock_llm.set_quirks(cut_mid_stream=True)
    story = "The ancient dragon, known for its majestic size and fire, slept on."
    mock_llm.configure([{"text": story, "stream": True}])
    send(page, "Tell me a story")
    page.wait_for_selector("#status[data-status=failed]")
    live = page.wait_for_selector("#transcript li.entry.assistant.incomplete")
    assert "Incomplete" in live.inner_text()
    live_text = live.query_selector(".bubble").inner_text()
    assert live_text and story.startswith(live_text) and live_text != story
    assert "broke during its answer" in page.inner_text("#transcript")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    stored = page.wait_for_selector("#transcript li.entry.assistant.incomplete .bubble")
    assert stored.inner_text() == live_text
    # The picture once the page has read everything: the turn's usage line (from
    # `…/responses`), the sidebar's count and the inbox's.
    page.wait_for_selector("#transcript li.usage-line")
    page.wait_for_selector(f"#side-list li[data-id='{session_id}'] .side-count")
    page.wait_for_selector("#inbox-count:not([hidden])")
    shot(page, "web-incomplete-answer")
    context.close()


def test_runners_page_registers_with_the_start_command_and_revokes(
    browser: Any, server: Server
) -> None:
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    page.goto(f"{server.url}/runners")
    page.fill("#runner-name", "laptop")
    page.click("#register-form button[type=submit]")
    page.wait_for_selector("#registered:not([hidden])")
    command = page.inner_text("#start-command")
    token = page.inner_text("#binding-token")
    assert token and token in command and server.url in command
    row = page.wait_for_selector("#runner-rows tr")
    assert "laptop" in row.inner_text() and "offline" in row.inner_text()
    shot(page, "web-runners")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#runner-rows button.danger")
    with server.client() as client:
        wait_until(
            lambda: client.get("/v1/runners").json()["data"] == [],
            deadline_s=10,
            what="the runner to be revoked",
        )
    context.close()


def test_approve_decline_attach_edit_a_file_and_fork(
    browser: Any,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    guarded = make_bundle("guarded", extra=OS_ENV + "guardrails:\n  ask_on_os_tools: true\n")
    session_id = create_session(server, guarded, title="Guarded")
    bind(server, session_id, runner.runner_id)
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/s/{session_id}")
    page.wait_for_selector("body[data-ready='1']")

    # Two tool calls that need a person: approve one, decline the other.
    mock_llm.configure(
        [
            {"tool_calls": [{"call_id": "c1", "name": "sys_os_write",
                             "arguments": {"path": "yes.txt", "content": "approved\n"}}]},
            {"tool_calls": [{"call_id": "c2", "name": "sys_os_write",
                             "arguments": {"path": "no.txt", "content": "declined\n"}}]},
            {"text": "Both asked."},
            {"text": "Noted."},
        ]
    )  # fmt: skip
    notes = tmp_path / "notes.txt"
    notes.write_text("attached notes for the agent\n")
    page.set_input_files("#attach", [str(notes)])
    send(page, "Write two files")
    first = page.wait_for_selector("#approvals li.approval")
    assert "yes.txt" in first.inner_text()
    shot(page, "web-approval")
    first.query_selector("button.approve").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('#approvals li.approval')]"
        ".some(n => n.innerText.includes('no.txt'))"
    )
    second = page.locator("#approvals li.approval")
    second.locator("input").fill("not that one")
    second.locator("button.decline").click()
    page.wait_for_selector("#status[data-status=idle]")
    assert page.locator("#approvals li.approval").count() == 0
    outputs = page.eval_on_selector_all(
        "#transcript .call-output", "ns => ns.map(n => n.textContent)"
    )
    assert any("declined by" in text and "not that one" in text for text in outputs), outputs
    # The attachment went to the model with the message, and shows in the transcript.
    first_request = json.dumps(mock_llm.requests[0])
    assert "notes.txt" in first_request
    # A file name is text too, never markup (XSS holds no path separator). Sent after the
    # picture of the approval card, which shows an ordinary conversation.
    hostile = tmp_path / f"{XSS}.txt"
    hostile.write_text("a file with a hostile name\n")
    page.set_input_files("#attach", [str(hostile)])
    send(page, "One more file")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#transcript .entry.assistant .bubble')]"
        ".some(n => n.innerText.includes('Noted.'))"
    )
    page.wait_for_selector("#status[data-status=idle]")
    attached = page.locator("#transcript .attachments a")
    assert attached.count() == 2
    assert attached.nth(0).inner_text().endswith("notes.txt")
    # Shown as the text it is (the browser sent the name's quotes as %22, the HTML
    # form encoding's escape for them).
    assert attached.nth(1).inner_text().endswith(XSS.replace('"', "%22") + ".txt")
    assert page.locator("#transcript img").count() == 0
    assert page.evaluate("() => document.body.dataset.pwned") is None

    # The workspace: open the approved file, edit it, save; it shows in the change set.
    page.wait_for_selector("#panel-workspace:not([hidden])")
    page.click("#ws-tree button:has-text('yes.txt')")
    page.wait_for_selector("#ws-file:not([hidden])")
    assert page.input_value("#ws-content") == "approved\n"
    page.fill("#ws-content", "approved\nand edited by a person\n")
    page.click("#ws-save")
    page.wait_for_selector("#changes li[data-path='yes.txt']")
    page.click("#changes li[data-path='yes.txt'] button")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#diff tr.add td.code')]"
        ".some(n => n.textContent === '+and edited by a person')"
    )
    assert page.locator("#changes li[data-path='no.txt']").count() == 0

    # Fork from the finished turn: a new session with the same conversation.
    page.click("#transcript .fork-here")
    page.wait_for_url(lambda url: session_id not in url and "/s/conv_" in url)
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("#title") == "Fork of Guarded"
    assert "Write two files" in transcript_texts(page)
    assert any("Both asked." in text for text in transcript_texts(page))
    assert errors == [], errors
    context.close()
