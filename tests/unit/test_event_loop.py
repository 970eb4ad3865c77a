"""``OMNIGENT_EVENT_LOOP``: the loop ``python -m omnigent_site.serve`` has daphne create
(``omnigent_site/runtime/event_loop.py``). The real server on uvloop, and bare daphne
on asyncio's, are in ``tests/e2e/test_bare_daphne.py``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from omnigent_site.runtime.event_loop import EventLoopChoiceError, install_event_loop, loop_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def default_policy() -> Iterator[None]:
    """Each test starts and ends with asyncio's own policy."""
    asyncio.set_event_loop_policy(None)
    yield
    asyncio.set_event_loop_policy(None)


def new_loop_name() -> str:
    """The implementation of the loop daphne's ``asyncio.new_event_loop()`` would get."""
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop) == (loop_name(loop) == "uvloop")
        return loop_name(loop)
    finally:
        loop.close()


@pytest.mark.parametrize("choice", ["", "auto", " AUTO ", "uvloop"])
def test_uvloop_by_default_and_on_request(choice: str) -> None:
    assert install_event_loop(choice) == "uvloop"
    assert new_loop_name() == "uvloop"


def test_asyncio_keeps_asyncios_own_loop() -> None:
    assert install_event_loop("asyncio") == "asyncio"
    assert new_loop_name() == "asyncio"


def test_auto_falls_back_to_asyncio_where_uvloop_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # ``import uvloop`` raises ImportError
    assert install_event_loop("auto") == "asyncio"
    assert new_loop_name() == "asyncio"


def test_uvloop_asked_for_where_it_is_not_installed_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(EventLoopChoiceError, match="uvloop is not installed"):
        install_event_loop("uvloop")
    assert new_loop_name() == "asyncio"


def test_an_unknown_loop_is_a_clear_error() -> None:
    with pytest.raises(EventLoopChoiceError, match="one of auto, uvloop, asyncio, not 'tokio'"):
        install_event_loop("tokio")
    assert new_loop_name() == "asyncio"


@pytest.mark.timeout(60)
def test_serve_refuses_an_unknown_loop_before_daphne_starts(tmp_path: Path) -> None:
    env = {**os.environ, "OMNIGENT_EVENT_LOOP": "tokio", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "omnigent_site.serve", "--port", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "omnigent_site.serve: OMNIGENT_EVENT_LOOP must be one of auto, uvloop, asyncio, not 'tokio'"
    )
    assert "Traceback" not in result.stderr
