"""The admin as a person sees it: the sessions list fits a 1,400 px wide window."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testing.processes import REPO, Runner, Server, bind, create_session
from tests.e2e.conftest import server_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WIDTH = 1400
PASSWORD = "pw-for-the-admin-test"
LONG_TITLE = "Refactor the billing module's invoice rounding and add tests " * 3


def create_superuser(tmp_path: Path) -> None:
    env = {
        **server_env(tmp_path),
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
    }
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "admin",
            "--email",
            "admin@example.com",
        ],
        cwd=REPO,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_sessions_list_fits_1400_pixels(
    browser: Any,
    server: Server,
    runner: Runner,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    create_superuser(tmp_path)
    for index in range(3):
        session_id = create_session(server, make_bundle(f"agent-with-a-long-name-{index}"))
        with server.client() as client:
            client.patch(f"/v1/sessions/{session_id}", json={"title": LONG_TITLE})
        bind(server, session_id, runner.runner_id)

    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    try:
        page.goto(f"{server.url}/admin/login/?next=/admin/agent_sessions/session/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#result_list")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 3
        table_right = page.evaluate(
            "document.querySelector('#result_list').getBoundingClientRect().right"
        )
        page_width = page.evaluate("document.documentElement.scrollWidth")
        assert table_right <= WIDTH, table_right
        assert page_width <= WIDTH, page_width
        # The runner's online state is a column of its own, shown as an icon.
        assert page.locator("#result_list img[alt='True']").count() == 3
    finally:
        page.close()
