"""``GET /v1/sessions?search_query=`` (lifecycle.md, Search) over the database's own
full-text index: words and prefixes, case and accents, ``%``/``_``/quotes literal,
snippets and the first matching item, the list's filters and cursors, and the index
kept by every write (runner items, edits, deletes, forks). CI runs this folder on
PostgreSQL too (``make test-postgres``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from runners import runner_events
from sessions import search
from sessions.models import Item, Session

from .conftest import ALICE, BOB, assert_error, upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def template(client_for, make_bundle) -> str:
    response = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(make_bundle("tmpl"))}, format="multipart"
    )
    assert response.status_code == 201
    return response.json()["id"]


def user(text: str, item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "message", "role": "user", "content": text}
    if item_id:
        item["id"] = item_id
    return item


def assistant(text: str, item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    if item_id:
        item["id"] = item_id
    return item


@pytest.fixture
def make(client_for, template):
    def create(*items: dict[str, Any], title: str | None = None, owner: str = ALICE) -> str:
        body: dict[str, Any] = {"agent_id": template, "initial_items": list(items)}
        if title is not None:
            body["title"] = title
        response = client_for(owner).post("/v1/sessions", body, format="json")
        assert response.status_code == 201, response.content
        return response.json()["id"]

    return create


def find(client_for, text: str, *, who: str = ALICE, **params: Any) -> list[dict[str, Any]]:
    response = client_for(who).get("/v1/sessions", {"search_query": text, **params})
    assert response.status_code == 200, response.content
    return response.json()["data"]


def ids(rows: list[dict[str, Any]]) -> set[str]:
    return {row["id"] for row in rows}


def test_words_and_prefixes_case_and_accents(client_for, make) -> None:
    deploy = make(user("Please deploy the Café server"), assistant("Déployé on staging"))
    other = make(user("nothing to see"), title="Weekly notes")
    assert ids(find(client_for, "deploy")) == {deploy}
    assert ids(find(client_for, "DEPL serv")) == {deploy}  # every word, prefixes
    assert ids(find(client_for, "cafe")) == {deploy}  # accent-insensitive
    assert ids(find(client_for, "deployé staging")) == {deploy}
    assert ids(find(client_for, "deploy weekly")) == set()  # not one document
    assert ids(find(client_for, "eploy")) == set()  # word starts only
    assert ids(find(client_for, "week")) == {other}  # title
    assert ids(find(client_for, "  ")) == {deploy, other}  # blank: no search
    plain = client_for(ALICE).get("/v1/sessions").json()["data"]
    assert all("search_snippet" not in row for row in plain)


def test_snippet_and_first_item(client_for, make) -> None:
    long_text = " ".join(["filler"] * 80) + " the Gateway timed out " + " ".join(["x"] * 80)
    session = make(
        user("hello", "item_a"),
        assistant(long_text, "item_b"),
        assistant("gateway again", "item_c"),
        title="gateways",
    )
    (row,) = find(client_for, "gateway")
    assert row["search_item_id"] == "item_b"
    snippet = row["search_snippet"]
    assert "«Gateway»" in snippet
    assert len(snippet.replace("«", "").replace("»", "")) <= 200
    assert snippet.replace("«", "").replace("»", "") in long_text
    # A title-only match names no item.
    make(user("unrelated"), title="Gateway review")
    rows = {row["id"]: row for row in find(client_for, "review")}
    (title_only,) = rows.values()
    assert title_only["search_snippet"] is None and title_only["search_item_id"] is None
    assert session not in rows


def test_tool_names_arguments_and_outputs(client_for, make) -> None:
    session = make(
        user("go"),
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup_weather",
            "arguments": '{"city": "Zürich"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 degrees"},
    )
    assert ids(find(client_for, "lookup")) == {session}
    assert ids(find(client_for, "zurich")) == {session}
    assert ids(find(client_for, "sunny degr")) == {session}


def test_wildcards_and_quotes_are_literal(client_for, make) -> None:
    percent = make(user("discount of 50% today"))
    underscore = make(user("call read_file now"))
    plain = make(user("50 readers file a read file"))
    quoted = make(user('she said "hello" twice'))
    assert ids(find(client_for, "%")) == {percent}
    assert ids(find(client_for, "50%")) == {percent}
    assert ids(find(client_for, "read_file")) == {underscore}
    assert ids(find(client_for, "_")) == {underscore}
    assert ids(find(client_for, '"hello"')) == {quoted}
    assert ids(find(client_for, "'")) == set()
    assert ids(find(client_for, "hello OR 50")) == set()  # no operators
    assert ids(find(client_for, 'NEAR("x" "y")')) == set()
    assert ids(find(client_for, "read")) == {underscore, plain}


def test_only_readable_sessions_and_filters_and_cursors(client_for, make, template) -> None:
    mine = [make(user(f"needle number {n}")) for n in range(5)]
    make(user("needle of bob"), owner=BOB)
    make(user("haystack"))
    assert ids(find(client_for, "needle")) == set(mine)
    first = find(client_for, "needle", limit=2, order="asc")
    assert [row["id"] for row in first] == mine[:2]
    second = find(client_for, "needle", limit=2, order="asc", after=mine[1])
    assert [row["id"] for row in second] == mine[2:4]
    assert ids(find(client_for, "needle", agent_id=template)) == set(mine)
    assert ids(find(client_for, "needle", agent_id="agent_nope")) == set()
    assert len(find(client_for, "needle", who=BOB)) == 1


def test_bad_queries_are_400(client_for) -> None:
    response = client_for(ALICE).get("/v1/sessions", {"search_query": "x" * 300})
    assert_error(response, 400, "invalid_input", mentions="search_query")
    response = client_for(ALICE).get("/v1/sessions", {"search_query": " ".join("w" * 20)})
    assert_error(response, 400, "invalid_input", mentions="search_query")


def test_the_index_follows_every_write(client_for, make) -> None:
    session = make(user("first words"), title="alpha")
    assert ids(find(client_for, "first")) == {session}
    # A runner's item (the one writer of runner output) and a message.
    runner_events.accept_message(
        session_id=session, created_by=ALICE, data=user("brand new question"), tools=[]
    )
    assert ids(find(client_for, "question")) == {session}
    item = Item.objects.get(
        session_id=session, data__content=[{"type": "input_text", "text": "first words"}]
    )
    item.data = {**item.data, "content": [{"type": "input_text", "text": "rewritten"}]}
    item.save()
    assert ids(find(client_for, "first")) == set()
    assert ids(find(client_for, "rewritten")) == {session}
    # Title changes.
    response = client_for(ALICE).patch(f"/v1/sessions/{session}", {"title": "omega"}, format="json")
    assert response.status_code == 200
    assert ids(find(client_for, "alpha")) == set()
    assert ids(find(client_for, "omega")) == {session}
    # A fork's copies are found in the fork too.
    fork = client_for(ALICE).post(f"/v1/sessions/{session}/fork", {}, format="json")
    assert fork.status_code == 201, fork.content
    assert ids(find(client_for, "rewritten")) == {session, fork.json()["id"]}
    # Deleting removes the index rows with the items.
    assert client_for(ALICE).delete(f"/v1/sessions/{session}").status_code == 200
    assert ids(find(client_for, "rewritten")) == {fork.json()["id"]}
    assert _index_rows(session) == 0


def _index_rows(session_id: str) -> int:
    from sessions import search_index

    table = search_index.ITEM_SEARCH if connection.vendor == "postgresql" else search_index.ITEM_FTS
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE session_id = %s", [session_id])
        return int(cursor.fetchone()[0])


def test_snippet_marks_each_matched_word() -> None:
    query = search.parse("fox jump")
    assert query is not None
    text = "The quick brown Fox jumps over the lazy dog; the fox jumped."
    assert search.snippet(text, query) == (
        "The quick brown «Fox» «jumps» over the lazy dog; the «fox» «jumped»."
    )
    long = "a " * 300 + "fox " + "b " * 300
    cut = search.snippet(long, query)
    assert "«fox»" in cut and len(cut) - 2 <= 200


def test_session_list_json_keeps_its_shape(client_for, make) -> None:
    make(user("shape check"))
    (row,) = find(client_for, "shape")
    plain = client_for(ALICE).get("/v1/sessions").json()["data"][0]
    assert set(row) == set(plain) | {"search_snippet", "search_item_id"}
    assert json.loads(json.dumps(row))["search_item_id"].startswith("")


def test_sessions_stay_readable_after_search_index_rebuild(make, client_for) -> None:
    from sessions import search_index

    session = make(user("rebuilt index"), title="kept")
    search_index.install(connection, rebuild=True)
    assert ids(find(client_for, "rebuilt")) == {session}
    assert ids(find(client_for, "kept")) == {session}
    assert Session.objects.filter(pk=session).exists()


# --- pages of matches: the window looked at first, then the whole index (issue 41) ---


def _later_item(session_id: str, item_id: str, text: str) -> None:
    """An item written after other sessions' items, so sessions' item ``seq`` ranges
    interleave (as when several sessions are active at once)."""
    Item.objects.create(session_id=session_id, id=item_id, type="message", data=user(text))


@pytest.fixture
def listed(client_for, make, grant):
    """Sessions in creation order: which of ALICE's match "needle" (and by which item),
    interleaved with non-matching ones and with BOB's matches; one of BOB's is shared
    with ALICE for reading, one of hers gets its match last, after the others' items."""
    expected: dict[str, str | None] = {}
    shared = None
    for n in range(14):
        if n % 5 == 1:
            bob = make(user(f"needle of bob {n}"), owner=BOB)
            if shared is None:
                shared = bob
                grant(bob, ALICE, 1, by=BOB)
                expected[bob] = None  # filled below
        elif n % 3 == 0:
            make(user(f"haystack {n}"), assistant("nothing here"))
        else:
            expected[
                make(user(f"intro {n}", f"item_{n}_a"), assistant(f"needle {n}", f"item_{n}_b"))
            ] = f"item_{n}_b"
    late = make(user("no match yet", "late_a"))
    _later_item(late, "late_b", "the needle arrives late")
    expected[late] = "late_b"
    # An item of the oldest matching session written after every other one.
    oldest = next(session_id for session_id in expected if session_id != shared)
    _later_item(oldest, "oldest_late", "needle again, later")
    first_of_shared = Item.objects.filter(session_id=shared).order_by("seq").first()
    expected[shared] = first_of_shared.id
    # The list's order (created_at, id), as the plain list shows it.
    plain = client_for(ALICE).get("/v1/sessions", {"limit": 100, "order": "asc"}).json()["data"]
    in_order = [row["id"] for row in plain if row["id"] in expected]
    assert len(in_order) == len(expected) >= 8
    return in_order, expected


def _walk(client_for, *, limit: int, order: str) -> list[dict]:
    """Every page of the search, following the ``after`` cursors."""
    rows: list[dict] = []
    params: dict = {"limit": limit, "order": order}
    while True:
        response = client_for(ALICE).get("/v1/sessions", {"search_query": "needle", **params})
        assert response.status_code == 200, response.content
        body = response.json()
        assert len(body["data"]) <= limit
        rows += body["data"]
        if not body["has_more"]:
            return rows
        params = {"limit": limit, "order": order, "after": body["last_id"]}


@pytest.mark.parametrize("window", [(1, 1), (2, 2), (50, 2)])
@pytest.mark.parametrize("limit", [1, 2, 3, 20])
def test_pages_follow_every_match_in_order(client_for, listed, monkeypatch, window, limit) -> None:
    """Whatever the window's size (tiny ones go to the whole index's filter most of the
    time), the pages hold exactly the readable matching sessions, in order, each with
    its first matching item."""
    in_order, expected = listed
    monkeypatch.setattr(search, "MIN_WINDOW", window[0])
    monkeypatch.setattr(search, "WINDOW_PER_ROW", window[1])
    for order in ("asc", "desc"):
        rows = _walk(client_for, limit=limit, order=order)
        wanted = in_order if order == "asc" else in_order[::-1]
        assert [row["id"] for row in rows] == wanted
        assert {row["id"]: row["search_item_id"] for row in rows} == expected
        assert all("«needle»" in row["search_snippet"] for row in rows)
    if limit < len(in_order):
        # Back from the last page with ``before``: the same rows.
        rows = _walk_back(client_for, limit=limit, start=in_order[-limit])
        assert [row["id"] for row in rows] == in_order[:-limit]


def _walk_back(client_for, *, limit: int, start: str) -> list[dict]:
    rows: list[dict] = []
    cursor = start
    while True:
        body = (
            client_for(ALICE)
            .get(
                "/v1/sessions",
                {"search_query": "needle", "limit": limit, "order": "asc", "before": cursor},
            )
            .json()
        )
        rows = body["data"] + rows
        if not body["has_more"]:
            return rows
        cursor = body["first_id"]


def test_a_full_window_answers_alone_and_a_sparse_one_reads_the_index(
    client_for, listed, monkeypatch
) -> None:
    in_order, _expected = listed
    calls: list[str] = []
    whole_index = search.filter_sessions

    def counted(queryset, query):
        calls.append(query.words[0].tokens[0])
        return whole_index(queryset, query)

    monkeypatch.setattr(search, "filter_sessions", counted)
    monkeypatch.setattr(search, "MIN_WINDOW", 1)
    monkeypatch.setattr(search, "WINDOW_PER_ROW", 1)
    # The newest sessions: two matches in a row fill a page of one and its one more.
    newest = client_for(ALICE).get("/v1/sessions", {"limit": 2}).json()["data"]
    assert all(row["id"] in in_order for row in newest)
    assert [row["id"] for row in find(client_for, "needle", limit=1)] == [in_order[-1]]
    assert calls == []
    # "haystack": in no more than one of any three sessions, never two in a row.
    rows = find(client_for, "haystack", limit=1)
    assert len(rows) == 1 and rows[0]["search_item_id"] is not None
    assert calls == ["haystack"]


def test_a_cursor_outside_the_matches_is_refused(client_for, listed, make) -> None:
    other = make(user("haystack only"))
    for side in ("after", "before"):
        response = client_for(ALICE).get("/v1/sessions", {"search_query": "needle", side: other})
        assert_error(response, 400, "invalid_input", mentions=side)


def test_never_a_match_in_a_session_the_caller_cannot_read(client_for, make, monkeypatch) -> None:
    """BOB's sessions match too, in the middle of ALICE's list: in no window, page or
    cursor walk does ALICE see one."""
    mine = []
    for n in range(6):
        make(user(f"secret {n}"), owner=BOB)
        mine.append(make(user(f"secret mine {n}")))
    monkeypatch.setattr(search, "MIN_WINDOW", 1)
    monkeypatch.setattr(search, "WINDOW_PER_ROW", 1)
    seen = [row["id"] for row in _walk_text(client_for, "secret")]
    assert seen == mine[::-1]
    assert len(find(client_for, "secret", who=BOB, limit=100)) == 6


def _walk_text(client_for, text: str) -> list[dict]:
    rows: list[dict] = []
    params: dict = {"limit": 1}
    while True:
        body = client_for(ALICE).get("/v1/sessions", {"search_query": text, **params}).json()
        rows += body["data"]
        if not body["has_more"]:
            return rows
        params = {"limit": 1, "after": body["last_id"]}
