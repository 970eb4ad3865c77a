"""Import rules the layout depends on.

- The server's and the runner's code never imports the test doubles or the tests:
  ``testing/`` (the mock LLM, process launchers, the TCP balancer) and ``tests/`` exist
  for tests, benchmarks and the demo; a production module that imported them would ship
  a test double, or fail where they are not installed.
- The import contracts of ``pyproject.toml`` (import-linter) hold, and each one fails on
  the import it forbids: apps in one direction (``api`` and ``web`` independent), the runner without Django, no test
  doubles in production, services and selectors without DRF (docs/architecture.md).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_APPS = (
    "api",
    "omnigent_site",
    "omnigent_runner",
    "sessions",
    "runners",
    "workspaces",
    "webhooks",
    "webhook_outbox",
    "audit",
    "usage",
    "web",
    "schedules",
)
FORBIDDEN = ("testing", "tests")
ROOT_PACKAGES = (*PRODUCTION_APPS, "testing")


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


def _lint_imports(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo", *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    """The layers, the Django-free runner and the DRF-free domain (pyproject.toml)."""
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def _contract_modules() -> dict[str, str]:
    """Every module the contracts name, with the imports they allow as exceptions.

    import-linter refuses a contract that names a missing module or an ignored import
    that no longer exists.
    """
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    sources: dict[str, str] = {}
    for contract in config["contracts"]:
        for name in contract.get("source_modules", []):
            sources.setdefault(name, "")
        for rule in contract.get("ignore_imports", []):
            importer, imported = (part.strip() for part in rule.split("->"))
            sources[importer] = sources.get(importer, "") + f"import {imported}\n"
            sources.setdefault(imported, "")
    return {name: source for name, source in sources.items() if "." in name}


def _fake_project(root: Path, modules: dict[str, str]) -> None:
    """The project's root packages as empty shells, plus the given module sources."""
    for package in ROOT_PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    for dotted, source in {**_contract_modules(), **modules}.items():
        (root / (dotted.replace(".", "/") + ".py")).write_text(source)


@pytest.mark.parametrize(
    ("module", "source", "contract"),
    [
        ("sessions.selectors", "import runners.models\n", "apps-in-one-direction"),
        ("workspaces.selectors", "from runners import dispatch\n", "apps-in-one-direction"),
        ("omnigent_site.urls", "import sessions.selectors\n", "apps-in-one-direction"),
        ("runners.services", "import api.views\n", "apps-in-one-direction"),
        ("webhook_outbox.events", "import sessions.models\n", "apps-in-one-direction"),
        ("runners.runner_events", "import webhooks.delivery\n", "apps-in-one-direction"),
        ("audit.services", "import sessions.models\n", "apps-in-one-direction"),
        ("api.views", "import web.views\n", "apps-in-one-direction"),
        ("web.views", "from api import views\n", "apps-in-one-direction"),
        ("runners.services", "import schedules.services\n", "apps-in-one-direction"),
        ("schedules.services", "import api.schedule_views\n", "apps-in-one-direction"),
        ("omnigent_runner.tunnel", "import django\n", "runner-without-django"),
        ("omnigent_runner.agent", "import sessions.models\n", "runner-without-django"),
        ("api.views", "import testing.mockllm\n", "no-test-doubles-in-production"),
        ("sessions.services", "import rest_framework\n", "domain-layer-without-drf"),
        ("audit.selectors", "import rest_framework\n", "domain-layer-without-drf"),
    ],
)
def test_the_contracts_catch_a_forbidden_import(
    tmp_path: Path, module: str, source: str, contract: str
) -> None:
    """Each contract of the project's configuration fails on the import it forbids."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    _fake_project(tmp_path, {module: source, "testing.mockllm": ""})
    (tmp_path / "rest_framework").mkdir()
    (tmp_path / "rest_framework" / "__init__.py").write_text("")
    result = _lint_imports(tmp_path, "--contract", contract)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
