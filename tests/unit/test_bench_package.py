"""``bench/`` is a package run as ``python -m bench.<name>``: every script imports as a
module of it, with no ``sys.path`` edits (``docs/testing.md``, Benchmarks)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Loaded by the benchmark's servers as settings and URLconf, not as scripts.
SERVER_SIDE = {"server_settings", "server_urls"}
SCRIPTS = sorted(
    path.stem for path in BENCH.glob("*.py") if path.stem not in SERVER_SIDE | {"__init__"}
)


def test_bench_is_a_package() -> None:
    assert (BENCH / "__init__.py").is_file()


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_imports_as_a_module_of_the_package(name: str) -> None:
    source = (BENCH / f"{name}.py").read_text()
    assert "sys.path" not in source
    assert "E402" not in source
    module = importlib.import_module(f"bench.{name}")
    if not name.startswith("_") and name not in {"bare_asgi", "tunnel_meter"}:
        assert callable(getattr(module, "main", None)), f"bench.{name} has no main()"
