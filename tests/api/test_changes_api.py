"""The workspace changes and diff endpoints, served from stored FileChange rows
(http-api.md, "Workspace changes"; agents.md, "Workspace change tracking").

Rows are written the way the tunnel writes them: through
``workspaces.services.apply_workspace_changes`` inside a transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from sessions.models import Permission, Session
from sessions.services import create_session_from_bundle
from workspaces.models import FileChange
from workspaces.services import apply_workspace_changes

from .conftest import ALICE, BOB, CAROL, assert_error

pytestmark = pytest.mark.django_db

ENTRY_KEYS = [
    "object",
    "path",
    "name",
    "status",
    "bytes",
    "modified_at",
    "lines_added",
    "lines_removed",
]


@pytest.fixture
def session(make_bundle: Callable[..., bytes]) -> Session:
    return create_session_from_bundle(user=get_or_create_user(ALICE), data=make_bundle())


@pytest.fixture
def alice(client_for: Callable[[str | None], APIClient]) -> APIClient:
    return client_for(ALICE)


def entry(path: str, status: str = "created", **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "path": path,
        "name": path.rsplit("/", 1)[-1],
        "status": status,
        "bytes": 5,
        "modified_at": 1718000000,
        "lines_added": 1,
        "lines_removed": 0,
    }
    base.update(extra)
    return base


def apply(session: Session, mode: str, *entries: dict[str, Any], env: str = "default") -> str:
    with transaction.atomic():
        return apply_workspace_changes(
            session=session,
            payload={"environment_id": env, "mode": mode, "entries": list(entries)},
        )


def changes_url(session: Session, env: str = "default") -> str:
    return f"/v1/sessions/{session.id}/resources/environments/{env}/changes"


def diff_url(session: Session, path: str, env: str = "default") -> str:
    return f"/v1/sessions/{session.id}/resources/environments/{env}/diff/{path}"


def listed(client: APIClient, session: Session) -> list[dict[str, Any]]:
    response = client.get(changes_url(session))
    assert response.status_code == 200, response.content
    body = response.json()
    assert list(body) == ["object", "has_more", "data"]
    assert body["object"] == "list" and body["has_more"] is False
    for item in body["data"]:
        assert list(item) == ENTRY_KEYS, item
    return list(body["data"])


def paths(client: APIClient, session: Session) -> list[tuple[str, str]]:
    return [(item["path"], item["status"]) for item in listed(client, session)]


def diff(client: APIClient, session: Session, path: str) -> dict[str, Any]:
    response = client.get(diff_url(session, path))
    assert response.status_code == 200, response.content
    return dict(response.json())


# --- shapes ---------------------------------------------------------------------------


def test_empty_change_set_is_an_empty_list(alice: APIClient, session: Session) -> None:
    response = alice.get(changes_url(session))
    assert response.status_code == 200
    assert response.json() == {"object": "list", "has_more": False, "data": []}


def test_entry_and_diff_have_the_exact_shapes(alice: APIClient, session: Session) -> None:
    assert (
        apply(
            session,
            "agent_edit",
            entry(
                "sub/hello.txt",
                bytes=19,
                lines_added=2,
                lines_removed=0,
                before=None,
                after="hello\nfrom the agent",
            ),
        )
        == "default"
    )
    response = alice.get(changes_url(session))
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "has_more": False,
        "data": [
            {
                "object": "session.environment.filesystem.entry",
                "path": "sub/hello.txt",
                "name": "hello.txt",
                "status": "created",
                "bytes": 19,
                "modified_at": 1718000000,
                "lines_added": 2,
                "lines_removed": 0,
            }
        ],
    }
    response = alice.get(diff_url(session, "sub/hello.txt"))
    assert response.status_code == 200
    assert response.json() == {
        "object": "session.environment.filesystem.file_diff",
        "path": "sub/hello.txt",
        "before": None,
        "after": "hello\nfrom the agent",
    }


def test_nullable_fields_are_null_and_name_defaults_to_the_basename(
    alice: APIClient, session: Session
) -> None:
    apply(
        session,
        "agent_edit",
        {"path": "deep/dir/gone.bin", "status": "deleted", "bytes": True, "lines_added": "3"},
    )
    [item] = listed(alice, session)
    assert item == {
        "object": "session.environment.filesystem.entry",
        "path": "deep/dir/gone.bin",
        "name": "gone.bin",
        "status": "deleted",
        "bytes": None,
        "modified_at": None,
        "lines_added": None,
        "lines_removed": None,
    }
    assert diff(alice, session, "deep/dir/gone.bin") == {
        "object": "session.environment.filesystem.file_diff",
        "path": "deep/dir/gone.bin",
        "before": None,
        "after": None,
    }


def test_paths_with_spaces_and_unicode_round_trip(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("docs/my notes é.md", before="a", after="b"))
    [item] = listed(alice, session)
    assert item["path"] == "docs/my notes é.md" and item["name"] == "my notes é.md"
    response = alice.get(diff_url(session, "docs/my%20notes%20%C3%A9.md"))
    assert response.status_code == 200
    assert response.json()["before"] == "a" and response.json()["after"] == "b"


# --- agent_edit payloads ----------------------------------------------------------------


def test_agent_edit_adds_updates_and_removes_paths(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("a.txt", before=None, after="one\n"))
    apply(session, "agent_edit", entry("b.txt", "modified", before="old\n", after="new\n"))
    assert sorted(paths(alice, session)) == [("a.txt", "created"), ("b.txt", "modified")]

    # A later payload only touches the paths it names.
    apply(session, "agent_edit", entry("a.txt", bytes=9, lines_added=2, after="one\ntwo\n"))
    items = {item["path"]: item for item in listed(alice, session)}
    assert items["a.txt"]["status"] == "created"
    assert items["a.txt"]["bytes"] == 9 and items["a.txt"]["lines_added"] == 2
    assert items["b.txt"]["status"] == "modified"
    assert diff(alice, session, "a.txt")["after"] == "one\ntwo\n"

    # Status "none": the path has no net change any more and is dropped.
    apply(session, "agent_edit", {"path": "a.txt", "status": "none"})
    assert paths(alice, session) == [("b.txt", "modified")]
    response = alice.get(diff_url(session, "a.txt"))
    assert_error(response, 404, "not_found")

    # "none" for a path that was never stored is a no-op.
    apply(session, "agent_edit", {"path": "never.txt", "status": "none"})
    assert paths(alice, session) == [("b.txt", "modified")]
    assert FileChange.objects.filter(session=session).count() == 1


def test_entries_without_before_after_keep_the_stored_content(
    alice: APIClient, session: Session
) -> None:
    apply(session, "agent_edit", entry("a.txt", "modified", before="v1\n", after="v2\n"))
    apply(session, "agent_edit", entry("a.txt", "modified", bytes=42))
    assert diff(alice, session, "a.txt") == {
        "object": "session.environment.filesystem.file_diff",
        "path": "a.txt",
        "before": "v1\n",
        "after": "v2\n",
    }
    assert listed(alice, session)[0]["bytes"] == 42

    # An explicit "after" replaces (a non-string clears it); an agent_edit path keeps
    # the session's first baseline.
    apply(session, "agent_edit", entry("a.txt", "modified", before="v1\n", after=7))
    body = diff(alice, session, "a.txt")
    assert (body["before"], body["after"]) == ("v1\n", None)

    apply(session, "git", entry("g.txt", "modified", before="head\n", after="work\n"))
    apply(session, "git", entry("g.txt", "modified", lines_added=3))
    body = diff(alice, session, "g.txt")
    assert (body["before"], body["after"]) == ("head\n", "work\n")
    assert listed(alice, session)[0]["lines_added"] == 3

    # In git mode explicit keys replace both sides.
    apply(session, "git", entry("g.txt", "modified", before=None, after=7))
    body = diff(alice, session, "g.txt")
    assert body["before"] is None and body["after"] is None


# --- agent_edit: the session's first operation wins over a fresh tracker's ----------------


def stored(session: Session, path: str) -> tuple[Any, ...]:
    row = FileChange.objects.get(session=session, path=path)
    return (row.status, row.before, row.after, row.lines_added, row.lines_removed)


def test_a_fresh_tracker_does_not_turn_a_created_path_into_modified(
    alice: APIClient, session: Session
) -> None:
    """A restarted runner's tracker sees the file the session created as pre-existing."""
    apply(session, "agent_edit", entry("a.txt", before=None, after="v1\n"))
    apply(
        session,
        "agent_edit",
        entry("a.txt", "modified", before="v1\n", after="v1b\n", lines_added=1, lines_removed=1),
    )
    assert stored(session, "a.txt") == ("created", None, "v1b\n", 1, 0)
    assert paths(alice, session) == [("a.txt", "created")]
    body = diff(alice, session, "a.txt")
    assert (body["before"], body["after"]) == (None, "v1b\n")

    # Then deleted: created and deleted in one session is no change at all.
    apply(session, "agent_edit", entry("a.txt", "deleted", before="v1b\n", after=None))
    assert paths(alice, session) == []


def test_a_fresh_tracker_keeps_the_first_baseline_of_a_modified_path(session: Session) -> None:
    apply(
        session,
        "agent_edit",
        entry("m.txt", "modified", before="orig\n", after="v1\n", lines_added=1, lines_removed=1),
    )
    apply(
        session,
        "agent_edit",
        entry(
            "m.txt", "modified", before="v1\n", after="orig\nmore\n", lines_added=2, lines_removed=1
        ),
    )
    assert stored(session, "m.txt") == ("modified", "orig\n", "orig\nmore\n", 1, 0)

    # A fresh tracker's created-then-deleted ("none") of a path the session modified.
    apply(session, "agent_edit", {"path": "m.txt", "status": "none", "before": None, "after": None})
    assert stored(session, "m.txt") == ("deleted", "orig\n", None, 0, 1)

    # Written again after the deletion: modified against the first baseline.
    apply(session, "agent_edit", entry("m.txt", before=None, after="orig\n"))
    assert stored(session, "m.txt") == ("modified", "orig\n", "orig\n", 0, 0)


def test_the_same_tracker_resending_its_net_state_changes_nothing(session: Session) -> None:
    """Entries from the tracker that recorded the row pass through unchanged."""
    apply(session, "agent_edit", entry("c.txt", before=None, after="a\n", lines_added=1))
    apply(session, "agent_edit", entry("c.txt", before=None, after="a\nb\n", lines_added=7))
    assert stored(session, "c.txt") == ("created", None, "a\nb\n", 7, 0)

    apply(
        session,
        "agent_edit",
        entry("d.txt", "modified", before="x\n", after="y\n", lines_added=5, lines_removed=5),
    )
    apply(
        session,
        "agent_edit",
        entry("d.txt", "deleted", before="x\n", after=None, lines_added=0, lines_removed=1),
    )
    assert stored(session, "d.txt") == ("deleted", "x\n", None, 0, 1)

    # Binary or oversized baselines have no line counts.
    apply(session, "agent_edit", entry("bin", "modified", before=None, after=None))
    apply(session, "agent_edit", entry("bin", "modified", before="text\n", after="t\n"))
    assert stored(session, "bin") == ("modified", None, "t\n", None, None)


# --- git payloads -----------------------------------------------------------------------


def test_git_payloads_replace_the_whole_set(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("from-agent.txt"))
    apply(session, "git", entry("a.txt"), entry("b.txt", "modified"), entry("c.txt", "deleted"))
    assert sorted(paths(alice, session)) == [
        ("a.txt", "created"),
        ("b.txt", "modified"),
        ("c.txt", "deleted"),
    ]

    apply(session, "git", entry("b.txt", "modified"), entry("d.txt"))
    assert sorted(paths(alice, session)) == [("b.txt", "modified"), ("d.txt", "created")]
    assert alice.get(diff_url(session, "a.txt")).status_code == 404

    # A "none" entry in a git payload is not kept either.
    apply(session, "git", entry("b.txt", "none"))
    assert paths(alice, session) == []

    apply(session, "git", entry("e.txt"))
    apply(session, "git")
    assert paths(alice, session) == []


def test_environments_are_kept_apart(alice: APIClient, session: Session) -> None:
    apply(session, "git", entry("other-env.txt"), env="scratch")
    apply(session, "git", entry("default-env.txt"))
    assert paths(alice, session) == [("default-env.txt", "created")]
    assert FileChange.objects.get(path="other-env.txt").environment_id == "scratch"
    # Only the "default" environment is served.
    assert_error(alice.get(changes_url(session, "scratch")), 404, "not_found")


def test_sessions_are_kept_apart(
    alice: APIClient, session: Session, make_bundle: Callable[..., bytes]
) -> None:
    other = create_session_from_bundle(user=get_or_create_user(ALICE), data=make_bundle())
    apply(other, "git", entry("theirs.txt"))
    apply(session, "git", entry("mine.txt"))
    assert paths(alice, session) == [("mine.txt", "created")]
    assert paths(alice, other) == [("theirs.txt", "created")]
    assert alice.get(diff_url(session, "theirs.txt")).status_code == 404


# --- ordering ---------------------------------------------------------------------------


def test_most_recently_changed_first(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("first.txt"))
    apply(session, "agent_edit", entry("second.txt"))
    apply(session, "agent_edit", entry("third.txt"))
    assert [p for p, _ in paths(alice, session)] == ["third.txt", "second.txt", "first.txt"]

    apply(session, "agent_edit", entry("first.txt", bytes=99))
    assert [p for p, _ in paths(alice, session)] == ["first.txt", "third.txt", "second.txt"]

    # An entry resent unchanged keeps its place.
    apply(session, "agent_edit", entry("second.txt"))
    assert [p for p, _ in paths(alice, session)] == ["first.txt", "third.txt", "second.txt"]

    # In a git snapshot only the entries that changed move to the top.
    apply(
        session,
        "git",
        entry("first.txt", bytes=99),
        entry("second.txt", "modified"),
        entry("third.txt"),
    )
    assert [p for p, _ in paths(alice, session)] == ["second.txt", "first.txt", "third.txt"]


# --- malformed payloads -----------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"mode": "svn", "entries": []},
        {"mode": "git", "entries": "a.txt"},
        {"mode": "git", "entries": [{"path": "a.txt", "status": "renamed"}]},
        {"mode": "git", "entries": [{"path": "", "status": "created"}]},
        {"mode": "git", "entries": [{"path": "a\x00b", "status": "created"}]},
        {"mode": "git", "entries": ["a.txt"]},
        {"mode": "git", "environment_id": "x" * 65, "entries": []},
    ],
    ids=["mode", "entries", "status", "empty-path", "nul", "not-object", "env"],
)
def test_malformed_payloads_raise_and_store_nothing(
    session: Session, payload: dict[str, Any]
) -> None:
    apply(session, "git", entry("kept.txt"))
    with pytest.raises(ValueError), transaction.atomic():
        apply_workspace_changes(session=session, payload=payload)
    assert list(FileChange.objects.filter(session=session).values_list("path", flat=True)) == [
        "kept.txt"
    ]


# --- access -----------------------------------------------------------------------------


def test_read_access_is_needed(
    client_for: Callable[[str | None], APIClient], session: Session
) -> None:
    apply(session, "agent_edit", entry("a.txt", before="x", after="y"))
    stranger = client_for(BOB)
    assert_error(stranger.get(changes_url(session)), 404, "not_found")
    assert_error(stranger.get(diff_url(session, "a.txt")), 404, "not_found")
    assert_error(stranger.get(changes_url(session, "other")), 404, "not_found")

    anonymous = client_for(None)
    assert_error(anonymous.get(changes_url(session)), 401, "unauthorized")
    assert_error(anonymous.get(diff_url(session, "a.txt")), 401, "unauthorized")

    Permission.objects.create(session=session, user=get_or_create_user(CAROL), level=1)
    reader = client_for(CAROL)
    assert [item["path"] for item in listed(reader, session)] == ["a.txt"]
    assert diff(reader, session, "a.txt")["after"] == "y"


def test_unknown_session_is_404(alice: APIClient) -> None:
    assert_error(
        alice.get("/v1/sessions/conv_missing/resources/environments/default/changes"),
        404,
        "not_found",
    )
    assert_error(
        alice.get("/v1/sessions/conv_missing/resources/environments/default/diff/a.txt"),
        404,
        "not_found",
    )


def test_a_deleted_session_is_404(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("a.txt"))
    assert alice.delete(f"/v1/sessions/{session.id}").status_code == 200
    assert_error(alice.get(changes_url(session)), 404, "not_found")
    assert FileChange.objects.count() == 0


# --- bad paths and environments ---------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../etc/passwd",
        "sub/../../x",
        "sub/..",
        "%2E%2E/x",
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "a%00b",
        "%00",
        "..\\x",
        "C:/x",
    ],
)
def test_bad_diff_paths_are_400(alice: APIClient, session: Session, path: str) -> None:
    apply(session, "agent_edit", entry("a.txt"))
    assert_error(alice.get(diff_url(session, path)), 400, "invalid_input")


def test_dots_inside_names_are_fine(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("sub/..hidden..txt"), entry(".env"))
    assert diff(alice, session, "sub/..hidden..txt")["path"] == "sub/..hidden..txt"
    assert diff(alice, session, ".env")["path"] == ".env"


def test_a_path_not_in_the_change_set_is_404(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("sub/a.txt"))
    assert_error(alice.get(diff_url(session, "sub/b.txt")), 404, "not_found")
    assert_error(alice.get(diff_url(session, "sub")), 404, "not_found")
    assert_error(alice.get(diff_url(session, "a.txt")), 404, "not_found")


def test_unknown_environment_is_404(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("a.txt"))
    assert_error(alice.get(changes_url(session, "other")), 404, "not_found")
    assert_error(alice.get(diff_url(session, "a.txt", env="other")), 404, "not_found")


def test_changes_endpoints_are_read_only(alice: APIClient, session: Session) -> None:
    apply(session, "agent_edit", entry("a.txt"))
    for method in ("post", "put", "patch", "delete"):
        response = getattr(alice, method)(changes_url(session), {}, format="json")
        assert response.status_code == 405, (method, response.content)
        assert response.json()["error"]["code"]
    assert [item["path"] for item in listed(alice, session)] == ["a.txt"]
