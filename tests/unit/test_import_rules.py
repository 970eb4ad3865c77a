"""Import rules the layout depends on.

- The server's and the runner's code never imports the test doubles or the tests:
  ``testing/`` (the mock LLM, process launchers, the TCP balancer) and ``tests/`` exist
  for tests, benchmarks and the demo; a production module that imported them would ship
  a test double, or fail where they are not installed.
- Services and selectors raise the project's own errors (``omnigent_site.domain_errors``),
  not DRF's HTTP exceptions: they are called from consumers and commands too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_APPS = ("omnigent_site", "omnigent_runner", "sessions", "runners", "workspaces")
FORBIDDEN = ("testing", "tests")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("app", PRODUCTION_APPS)
def test_production_code_does_not_import_test_code(app: str) -> None:
    offenders = {
        f"{path.relative_to(REPO)}: {module}"
        for path in (REPO / app).rglob("*.py")
        for module in _imported_modules(path)
        if module.split(".")[0] in FORBIDDEN
    }
    assert not offenders, sorted(offenders)


def test_the_rule_sees_an_import_of_the_test_doubles(tmp_path: Path) -> None:
    sample = tmp_path / "module.py"
    sample.write_text("import os\nfrom testing.mockllm import MockLLMServer\n")
    assert "testing.mockllm" in _imported_modules(sample)


DOMAIN_LAYER = [
    "sessions/services.py",
    "sessions/selectors.py",
    "runners/dispatch.py",
    "runners/runner_events.py",
    "runners/services.py",
    "workspaces/services.py",
]


@pytest.mark.parametrize("module", DOMAIN_LAYER)
def test_services_and_selectors_do_not_use_drf(module: str) -> None:
    imported = {name.split(".")[0] for name in _imported_modules(REPO / module)}
    assert "rest_framework" not in imported, module
