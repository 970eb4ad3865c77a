"""A real headless browser (Debian's chromium, driven by Playwright) against a real
daphne. In CI (`.ci/run` installs chromium) a missing browser is a failure; elsewhere
a clear skip."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.e2e.conftest import (  # noqa: F401 - the real server and runner fixtures
    launch_runner,
    launch_server,
    price_table,
    priced_runner,
    priced_server,
    runner,
    server,
    workspace,
)

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


@pytest.fixture
def browser() -> Iterator[Any]:
    """One browser per test. Playwright's sync API keeps an event loop on this thread
    while it is open, which would break every async test after it if it stayed open."""
    executable = chromium_path()
    if executable is None:
        message = "chromium is not installed (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            browser.close()
