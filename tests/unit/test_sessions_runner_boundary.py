"""The one dependency of ``sessions`` on ``runners`` that the import contracts cannot see.

``Session.runner`` is a foreign key named by string (``"runners.Runner"``), so
``sessions`` never imports ``runners``, yet a few places read the runner row through it:
the snapshot and list row shapes and the admin show ``runner.online``, and the
selectors join the runner's columns so that reading it costs no query.
docs/architecture.md ("Layers") states this exception; this test lists the places, so a
new one is a decision someone makes here rather than a dependency nobody sees.
"""

from __future__ import annotations

import ast
from pathlib import Path

SESSIONS = Path(__file__).resolve().parents[2] / "sessions"

# The attributes of the runner row, and the ORM paths that go through the relation.
RUNNER_ATTRIBUTES = {"runner", "online", "channel_name", "last_seen_at", "is_revoked"}

# (module, function): every place in sessions/ that reads the runner row.
ALLOWED = {
    # ``runner_online`` of the list row and the snapshot (and so of the snapshot's ETag).
    ("shapes.py", "session_row"),
    # The reads load the runner with the session, so ``runner_online`` costs no query:
    # the raw-SQL reads join its columns, the ORM list selects it.
    ("selectors.py", "_runner_model"),
    ("selectors.py", "_relations"),
    ("selectors.py", "_relations_sql"),
    ("selectors.py", "_session_list_rows_sql"),
    ("selectors.py", "sessions_granted_to"),
    # The admin's "runner online" column and its raw id field.
    ("admin.py", "SessionAdmin"),
    ("admin.py", "SessionAdmin.runner_online"),
    # ``session.runner`` on the session stream: the bound runner's name and online state,
    # read with the sessions bound to it (one query) and rendered per session.
    ("runner_presence.py", "_publish"),
    ("stream_events.py", "session_runner_event"),
    # The relation itself, and its index.
    ("models.py", "Session"),
    ("models.py", "Session.Meta"),
}


def _touches_runner(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in RUNNER_ATTRIBUTES
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value
        return value in {"runner", "runners.Runner"} or value.startswith("runner__")
    return False


def runner_touches(source: str) -> set[str]:
    """The qualified names of the functions and classes that read the runner row."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name])
                continue
            if _touches_runner(child):
                found.add(".".join(scope) or "<module>")
            visit(child, scope)

    visit(ast.parse(source), [])
    return found


def test_only_the_listed_places_in_sessions_read_the_runner() -> None:
    found = {
        (path.name, name)
        for path in sorted(SESSIONS.glob("*.py"))
        for name in runner_touches(path.read_text(encoding="utf-8"))
    }
    assert found - ALLOWED == set(), "a new place reads the runner row; list it or move it"
    assert ALLOWED - found == set(), "a listed place no longer reads the runner row"


def test_the_scan_sees_a_runner_read() -> None:
    source = (
        "def f(session):\n    return session.runner.online\n"
        "class A:\n    def g(self, qs):\n        return qs.select_related('runner')\n"
        "def h(session):\n    return session.runner_id\n"
    )
    assert runner_touches(source) == {"f", "A.g"}
