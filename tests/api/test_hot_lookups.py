"""The plain-SQL lookups every request makes (``omnigent_site/rawsql.py``).

They must read exactly what the ORM reads (field conversions included) on SQLite
and on PostgreSQL (CI runs this folder on both), in a fixed, small number of
queries.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from omnigent_site.domain_errors import Forbidden, NotFound
from omnigent_site.rawsql import (
    first_row,
    insert_row,
    insert_rows,
    insert_values,
    joined_columns,
    quoted,
    row_by,
    rows,
    update_row,
    update_rows,
)
from omnigent_site.users import get_or_create_user
from runners.models import Runner
from runners.services import register_runner
from sessions import selectors
from sessions.models import Approval, Item, Permission, Session, SessionEvent, Turn
from sessions.services import create_session_from_bundle, grant_permission

from .conftest import ALICE, BOB, CAROL

pytestmark = pytest.mark.django_db


def field_values(instance: object) -> dict[str, object]:
    return {
        field.attname: getattr(instance, field.attname)
        for field in instance._meta.concrete_fields  # type: ignore[attr-defined]
    }


@pytest.fixture
def session(make_bundle: Callable[..., bytes]) -> Session:
    alice = get_or_create_user(ALICE)
    created = create_session_from_bundle(user=alice, data=make_bundle())
    Session.objects.filter(pk=created.pk).update(
        labels={"team": "core", "n": "1"}, last_task_error={"code": "x", "message": "é"}
    )
    return Session.objects.get(pk=created.pk)


@pytest.fixture
def runner() -> Runner:
    runner, _token = register_runner(owner=get_or_create_user(ALICE), name="laptop")
    Runner.objects.filter(pk=runner.pk).update(
        channel_name="specific.abc!def",
        last_seen_at=timezone.now(),
        workspace={"root": "/w", "mode": "agent_edit"},
    )
    return Runner.objects.get(pk=runner.pk)


def test_row_by_reads_what_the_orm_reads(session: Session, runner: Runner) -> None:
    for model, instance in ((Session, session), (Runner, runner)):
        raw = row_by(model, "id", instance.pk)
        assert raw is not None and type(raw) is model
        assert field_values(raw) == field_values(model.objects.get(pk=instance.pk))
    raw_session = row_by(Session, "id", session.pk)
    assert raw_session is not None
    assert raw_session.labels == {"team": "core", "n": "1"}
    assert isinstance(raw_session.created_at, datetime) and timezone.is_aware(
        raw_session.created_at
    )


def test_row_by_is_none_for_a_missing_row_and_takes_any_text_as_a_parameter() -> None:
    alice = get_or_create_user(ALICE)
    assert row_by(Runner, "id", "runner_token_missing") is None
    assert row_by(Runner, "id", "x' OR '1'='1") is None
    User = get_user_model()
    assert row_by(User, User.USERNAME_FIELD, "x' OR '1'='1") is None
    assert row_by(User, User.USERNAME_FIELD, '"; DROP TABLE auth_user; --') is None
    found = row_by(User, User.USERNAME_FIELD, ALICE)
    assert found is not None and found.pk == alice.pk


def test_header_users_are_found_and_created_once() -> None:
    User = get_user_model()
    created = get_or_create_user("new.person@example.com")
    assert created.email == "new.person@example.com"
    assert not created.has_usable_password()
    again = get_or_create_user("new.person@example.com")
    assert again.pk == created.pk
    assert User.objects.filter(username="new.person@example.com").count() == 1


def test_session_for_is_one_query_with_runner_and_agent(
    session: Session, runner: Runner, django_assert_num_queries: Callable[..., object]
) -> None:
    alice = get_or_create_user(ALICE)
    agent_name = session.agent.name
    with django_assert_num_queries(1):  # session + grant + agent; no runner bound
        found, level = selectors.session_for(session_id=session.pk, user=alice, level=1)
    assert level == Permission.Level.OWNER
    with django_assert_num_queries(0):
        assert found.runner is None
        assert found.agent.name == agent_name
    Session.objects.filter(pk=session.pk).update(runner=runner)
    with django_assert_num_queries(1):  # session + grant + runner + agent
        found, _ = selectors.session_for(session_id=session.pk, user=alice, level=4)
    with django_assert_num_queries(0):
        assert found.runner is not None and found.runner.channel_name == "specific.abc!def"
        assert found.runner.online
        assert found.agent.name == agent_name
    # The joined rows are what the ORM reads, conversions included.
    assert field_values(found.runner) == field_values(Runner.objects.get(pk=runner.pk))
    assert field_values(found.agent) == field_values(session.agent)
    assert field_values(found) == field_values(Session.objects.get(pk=session.pk))
    with django_assert_num_queries(1):  # the relay's hot path skips the agent
        found, _ = selectors.session_for(
            session_id=session.pk, user=alice, level=2, with_agent=False
        )
    assert found.runner is not None and found.runner.pk == runner.pk
    assert not Session.agent.is_cached(found)
    assert field_values(found) == field_values(Session.objects.get(pk=session.pk))


def test_session_list_rows_are_one_query_with_grantees_and_open_questions(
    session: Session, runner: Runner, django_assert_num_queries: Callable[..., object]
) -> None:
    """Each direct grantee's row (and level), the runner, the agent and the open-question
    count come in one statement, the row's fields as the ORM reads them."""
    alice, bob = get_or_create_user(ALICE), get_or_create_user(BOB)
    get_or_create_user(CAROL)  # no grant: no row
    grant_permission(session=session, actor=alice, user_id=BOB, level=Permission.Level.EDIT)
    turn = Turn.objects.create(session=session)
    for n, status in enumerate(["pending", "accepted", "pending"]):
        Approval.objects.create(
            id=f"elicit_{n}",
            session=session,
            response_id=turn.id,
            call_id=f"call_{n}",
            tool="sys_os_write",
            policy_name="ask",
            message="may I?",
            status=status,
            expires_at=timezone.now(),
        )
    for bound in (None, runner):
        Session.objects.filter(pk=session.pk).update(runner=bound)
        with django_assert_num_queries(1):
            found = selectors.session_list_rows(session_id=session.pk)
        assert sorted((user_pk, level) for user_pk, level, _row in found) == sorted(
            Permission.objects.filter(session=session).values_list("user_id", "level")
        )
        assert sorted((user_pk, level) for user_pk, level, _row in found) == sorted(
            [(alice.pk, 4), (bob.pk, 2)]
        )
        for _user_pk, _level, row in found:
            with django_assert_num_queries(0):
                assert row.runner == bound
                assert row.agent.pk == session.agent_id
                assert row.pending_elicitations_count == 2  # type: ignore[attr-defined]
            assert field_values(row) == field_values(Session.objects.get(pk=session.pk))
    [(user_pk, level, row)] = selectors.session_list_rows(session_id=session.pk, user_pk=bob.pk)
    assert (user_pk, level, row.pk) == (bob.pk, 2, session.pk)
    assert selectors.session_list_rows(session_id=session.pk, user_pk=999_999) == []
    assert selectors.session_list_rows(session_id="conv_missing") == []


def test_joined_rows_split_columns_by_relation_and_keep_extra_columns(
    session: Session, runner: Runner
) -> None:
    """``rows(joined=...)``: each joined model gets its own columns (even those named
    like the main model's), a NULL join gives None, and the plans are reused."""
    Session.objects.filter(pk=session.pk).update(runner=runner)
    other = Session.objects.create(
        id="conv_joined_other", agent=session.agent, created_by=session.created_by
    )
    runner_columns = joined_columns(Runner, "r", "runner")
    sql = (
        f"SELECT s.*, 5 AS answer, {runner_columns} FROM {quoted(Session)} s "
        f"LEFT JOIN {quoted(Runner)} r ON r.{quoted(Runner, 'id')} = s.{quoted(Session, 'runner')} "
        f"ORDER BY s.{quoted(Session, 'id')}"
    )
    for _ in range(2):
        found = {row.pk: row for row in rows(Session, sql, [], joined={"runner": Runner})}
        assert set(found) == {session.pk, other.pk}
        assert found[other.pk].runner is None and found[other.pk].runner_id is None
        bound = found[session.pk]
        assert bound.runner is not None
        assert raw_state(bound.runner) == raw_state(
            Runner.objects.raw(
                f"SELECT * FROM {quoted(Runner)} WHERE {quoted(Runner, 'id')} = %s", [runner.pk]
            )[0]
        )
        assert bound.answer == 5  # type: ignore[attr-defined]
        assert not hasattr(bound, "runner__id")
        assert field_values(bound) == field_values(Session.objects.get(pk=session.pk))


def test_session_for_levels_strangers_and_admins(session: Session) -> None:
    alice = get_or_create_user(ALICE)
    bob = get_or_create_user(BOB)
    carol = get_or_create_user(CAROL)
    grant_permission(session=session, actor=alice, user_id=BOB, level=Permission.Level.READ)
    _, level = selectors.session_for(session_id=session.pk, user=bob, level=1)
    assert level == Permission.Level.READ
    with pytest.raises(Forbidden):
        selectors.session_for(session_id=session.pk, user=bob, level=2)
    with pytest.raises(NotFound):
        selectors.session_for(session_id=session.pk, user=carol, level=1)
    with pytest.raises(NotFound):
        selectors.session_for(session_id="conv_missing", user=alice, level=1)
    carol.is_staff = True
    carol.save(update_fields=["is_staff"])
    _, level = selectors.session_for(session_id=session.pk, user=carol, level=4)
    assert level == 4
    with pytest.raises(NotFound):
        selectors.session_for(session_id="conv_missing", user=carol, level=1)


def raw_state(instance: Model) -> dict[str, object]:
    """Everything an instance read from a row carries: field values, annotations, state."""
    return {
        **field_values(instance),
        **{
            name: value
            for name, value in vars(instance).items()
            if not name.startswith("_") and name not in field_values(instance)
        },
        "_state.db": instance._state.db,
        "_state.adding": instance._state.adding,
        "_type": type(instance),
    }


def test_rows_builds_what_django_raw_builds_for_every_model(
    session: Session, runner: Runner
) -> None:
    """The guard of ``rawsql.rows``: it reimplements ``RawQuerySet``'s row handling
    with cached plans, so every stored model, read whole, must come out identical."""
    Session.objects.filter(pk=session.pk).update(runner=runner)
    grant_permission(
        session=session,
        actor=get_or_create_user(ALICE),
        user_id=BOB,
        level=Permission.Level.READ,
    )
    compared = 0
    for model in apps.get_models():
        if not model._default_manager.exists():
            continue
        sql = f"SELECT * FROM {quoted(model)}"
        ours = rows(model, sql, [])
        theirs = list(model._default_manager.raw(sql))
        assert [raw_state(row) for row in ours] == [raw_state(row) for row in theirs], model
        compared += 1
    assert compared >= 6  # users, agents, sessions, runners, permissions, items at least


def test_rows_takes_columns_in_any_order_and_keeps_extra_columns(session: Session) -> None:
    pk, title, created = (
        quoted(Session, "id"),
        quoted(Session, "title"),
        quoted(Session, "created_at"),
    )
    sql = f"SELECT {created}, 7 AS answer, {title}, {pk} FROM {quoted(Session)} WHERE {pk} = %s"
    for _ in range(2):  # the second read uses the kept plan
        (ours,) = rows(Session, sql, [session.pk])
        (theirs,) = Session.objects.raw(sql, [session.pk])
        # Before any field is read: reading a deferred field loads it.
        assert ours.get_deferred_fields() == theirs.get_deferred_fields() != set()
        assert raw_state(ours) == raw_state(theirs)
        assert ours.answer == 7  # type: ignore[attr-defined]
        assert isinstance(ours.created_at, datetime) and timezone.is_aware(ours.created_at)
    with_grant = first_row(Session, selectors._session_with_grant_sql(), [None, session.pk])
    assert with_grant is not None and with_grant.caller_level is None  # type: ignore[attr-defined]
    assert first_row(Session, sql, ["conv_missing"]) is None
    with pytest.raises(ValueError, match="primary key"):
        rows(Session, f"SELECT {title} FROM {quoted(Session)}", [])


def test_snapshot_reads_match_the_orm_in_order(session: Session) -> None:
    """The snapshot's items and open questions, read in plain SQL, are the ORM's rows in
    the ORM's order (items by ``seq``; questions oldest first, then by id)."""
    from runners import runner_events  # the layer above sessions stores a message

    alice = get_or_create_user(ALICE)
    for text in ("one", "two", "three"):
        runner_events.accept_message(
            session_id=session.pk,
            created_by=alice.username,
            data={"role": "user", "content": [{"type": "input_text", "text": text}]},
            tools=[],
        )
    items = selectors.snapshot_items(session_id=session.pk)
    assert [field_values(item) for item in items] == [
        field_values(item) for item in selectors.session_items(session=session)
    ]
    assert [item.data["content"][0]["text"] for item in items] == ["one", "two", "three"]
    assert selectors.snapshot_items(session_id="conv_missing") == []

    # A turn's output, read in plain SQL at its end: the ORM's items of the turn in
    # order, the user input that started it left out.
    turn = Turn.objects.filter(session=session).first()
    assert turn is not None
    Item.objects.create(
        session=session, id="item_out_2", response_id=turn.id, type="message", data={"role": "x"}
    )
    Item.objects.create(
        session=session, id="item_out_1", response_id=turn.id, type="reasoning", data={"n": 1}
    )
    expected = [
        item.flat()
        for item in Item.objects.filter(session=session, response_id=turn.id).order_by("seq")
        if item.data.get("role") != "user"
    ]
    assert selectors.response_output(response=turn) == expected
    assert [entry["id"] for entry in expected] == ["item_out_2", "item_out_1"]

    asked_at = timezone.now()
    for n, status in enumerate(["pending", "accepted", "pending", "pending"]):
        Approval.objects.create(
            id=f"elicit_{9 - n}",  # ids against creation order: the time sorts first
            session=session,
            response_id=turn.id,
            call_id=f"call_{n}",
            tool="sys_os_write",
            arguments={"path": f"{n}.txt"},
            policy_name="ask",
            message="may I?",
            status=status,
            expires_at=asked_at,
        )
    Approval.objects.filter(pk="elicit_6").update(created_at=asked_at)
    Approval.objects.filter(pk="elicit_7").update(created_at=asked_at)
    pending = selectors.pending_approvals(session_id=session.pk)
    expected = Approval.objects.filter(session=session, status="pending").order_by(
        "created_at", "id"
    )
    assert [field_values(a) for a in pending] == [field_values(a) for a in expected]
    assert [a.id for a in pending][:2] == ["elicit_6", "elicit_7"]  # same time: by id
    assert len(pending) == 3


def test_insert_rows_stores_what_bulk_create_stores(
    session: Session, django_assert_num_queries: Callable[..., object]
) -> None:
    """The guard of ``rawsql.insert_rows``: the same rows as ``bulk_create`` (JSON,
    text, integers, ``auto_now_add``), in one statement, and the instances marked saved."""
    payloads = [
        {"type": "response.output_text.delta", "delta": 'é "quoted" \\ and\nnewline'},
        {"type": "session.status", "status": "idle", "error": None, "nested": {"n": [1, 2.5]}},
    ]

    def events(first_seq: int) -> list[SessionEvent]:
        return [
            SessionEvent(session=session, seq=first_seq + n, type=p["type"], payload=p)
            for n, p in enumerate(payloads)
        ]

    ours, theirs = events(1001), events(2001)
    before = timezone.now()
    with django_assert_num_queries(1):
        insert_rows(SessionEvent, ours)
    SessionEvent.objects.bulk_create(theirs)
    assert all(not event._state.adding and event._state.db == "default" for event in ours)
    assert all(event.created_at >= before for event in ours)  # auto_now_add applied
    stored = {
        event.seq: event for event in SessionEvent.objects.filter(session=session, seq__gt=1000)
    }
    columns = ("session_id", "type", "payload")
    for mine, reference in zip(ours, theirs, strict=True):
        a, b = stored[mine.seq], stored[reference.seq]
        assert [getattr(a, name) for name in columns] == [getattr(b, name) for name in columns]
        assert a.created_at == mine.created_at and timezone.is_aware(a.created_at)
    insert_rows(SessionEvent, [])  # nothing to store: no statement


def test_insert_rows_splits_what_one_statement_cannot_hold(session: Session) -> None:
    many = [
        SessionEvent(session=session, seq=5000 + n, type="t", payload={"type": "t", "n": n})
        for n in range(1200)
    ]
    fields = [field for field in SessionEvent._meta.concrete_fields if not field.primary_key]
    size = connection.ops.bulk_batch_size(fields, many) or len(many)
    with CaptureQueriesContext(connection) as queries:
        insert_rows(SessionEvent, many)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == -(-len(many) // size)  # SQLite: 999 parameters a statement
    stored = SessionEvent.objects.filter(session=session, seq__gte=5000).order_by("seq")
    assert [event.payload["n"] for event in stored] == list(range(1200))


def test_update_row_writes_what_the_orms_update_writes(
    session: Session, runner: Runner, django_assert_num_queries: Callable[..., object]
) -> None:
    """The guard of ``rawsql.update_row``: JSON (nested, non-ASCII, null), text,
    integers, an aware datetime and a foreign key stored as the ORM's ``update()`` stores
    the same values, in one statement; nothing else of the row changes."""
    turn = Turn.objects.create(session=session)
    before = field_values(Session.objects.get(pk=session.pk))
    values = {
        "last_task_error": {"code": "x", "message": 'é "q" \\ \n', "n": [1, 2.5, None]},
        "title": "naïve ✓",
        "last_event_seq": 41,
        "updated_at": timezone.now(),
        "active_response_id": turn.id,
        "runner": runner,  # a foreign key: its column gets the related row's key
    }
    for name, value in values.items():
        setattr(session, name, value)
    with django_assert_num_queries(1):
        assert update_row(session, list(values)) == 1
    mine = field_values(Session.objects.get(pk=session.pk))
    written = {"last_task_error", "title", "last_event_seq", "updated_at"}
    written |= {"active_response_id", "runner_id"}
    assert {k: v for k, v in mine.items() if k not in written} == {
        k: v for k, v in before.items() if k not in written
    }
    Session.objects.filter(pk=session.pk).update(**values)  # the same values, by the ORM
    assert mine == field_values(Session.objects.get(pk=session.pk))
    assert mine["last_task_error"] == values["last_task_error"]
    session.last_task_error = None  # JSON null is SQL NULL, as the ORM stores it
    update_row(session, ["last_task_error"])
    assert Session.objects.filter(pk=session.pk, last_task_error__isnull=True).exists()
    gone = Turn(seq=-1, id="resp_missing", session=session)
    assert update_row(gone, ["status"]) == 0
    with pytest.raises(ValueError, match="not expressions"):
        session.last_event_seq = F("last_event_seq") + 1  # type: ignore[assignment]
        update_row(session, ["last_event_seq"])


def test_insert_values_stores_what_bulk_create_stores(
    session: Session, django_assert_num_queries: Callable[..., object]
) -> None:
    """The guard of ``rawsql.insert_values``: rows given as values (a foreign key's key,
    JSON, text, an aware datetime) stored as ``bulk_create`` stores the same, in one
    statement; ``ignore_conflicts`` skips a row whose unique key exists, as
    ``bulk_create``'s does, and without it the conflict is an error."""
    at = timezone.now()
    payload = {"type": "t", "delta": 'é "q" \\ \n', "n": [1, 2.5, None]}
    names = ("session", "seq", "type", "payload", "created_at")
    with django_assert_num_queries(1):
        insert_values(
            SessionEvent,
            names,
            [(session.pk, 7001, "t", payload, at), (session.pk, 7002, "u", {}, at)],
        )
    SessionEvent.objects.bulk_create(
        [SessionEvent(session=session, seq=8001, type="t", payload=payload)]
    )
    SessionEvent.objects.filter(seq=8001).update(created_at=at)
    mine, theirs = (SessionEvent.objects.get(session=session, seq=seq) for seq in (7001, 8001))
    assert [mine.type, mine.payload, mine.created_at] == [
        theirs.type,
        theirs.payload,
        theirs.created_at,
    ]
    assert timezone.is_aware(mine.created_at)
    insert_values(SessionEvent, names, [(session.pk, 7001, "other", {}, at)], ignore_conflicts=True)
    assert SessionEvent.objects.get(session=session, seq=7001).type == "t"
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_values(SessionEvent, names, [(session.pk, 7002, "other", {}, at)])
    insert_values(SessionEvent, names, [])  # nothing to store: no statement


def test_update_rows_writes_what_update_row_writes(
    make_bundle: Callable[..., bytes], django_assert_num_queries: Callable[..., object]
) -> None:
    """The guard of ``rawsql.update_rows``: each row gets its own values (JSON, text,
    an aware datetime, NULL), as ``update_row`` writes them, in one statement run for
    every row; the fields not named are left alone."""
    alice = get_or_create_user(ALICE)
    one, two, three = (create_session_from_bundle(user=alice, data=make_bundle()) for _ in "123")
    untouched = field_values(Session.objects.get(pk=three.pk))
    one.title, one.last_task_error, one.updated_at = "naïve ✓", {"code": "é"}, timezone.now()
    two.title, two.last_task_error, two.updated_at = "two", None, timezone.now()
    with django_assert_num_queries(1):
        update_rows([one, two], ["title", "last_task_error", "updated_at"])
    for instance in (one, two):
        stored = Session.objects.get(pk=instance.pk)
        assert [stored.title, stored.last_task_error, stored.updated_at] == [
            instance.title,
            instance.last_task_error,
            instance.updated_at,
        ]
    assert field_values(Session.objects.get(pk=three.pk)) == untouched
    update_rows([], ["title"])  # nothing to write: no statement


def test_insert_row_stores_what_create_stores(
    session: Session, django_assert_num_queries: Callable[..., object]
) -> None:
    """The guard of ``rawsql.insert_row``: a turn (its key a default of the model) and an
    item (its key generated by the database, read back) stored as ``objects.create``
    stores the same values, in one statement each, the instances marked saved."""
    tools = [{"type": "function", "name": "é", "parameters": {"n": [1, 2.5, None]}}]
    before = timezone.now()
    turn = Turn(session=session, tools=tools)
    with django_assert_num_queries(1):
        insert_row(turn)
    assert not turn._state.adding and turn._state.db == "default"
    reference = Turn.objects.create(session=session, tools=tools)
    mine, theirs = field_values(Turn.objects.get(pk=turn.pk)), field_values(reference)
    assert mine["created_at"] >= before and timezone.is_aware(mine["created_at"])
    assert mine["created_at"] == turn.created_at  # auto_now_add, on the instance too
    # The time of each default.
    different = {"seq", "id", "created_at", "dispatched_at", "start_acked_at"}
    for name in ("dispatched_at", "start_acked_at"):
        assert mine[name] >= before and timezone.is_aware(mine[name])
    assert {k: v for k, v in mine.items() if k not in different} == {
        k: v for k, v in theirs.items() if k not in different
    }

    def item(item_id: str) -> Item:
        return Item(
            session=session,
            id=item_id,
            response_id=turn.id,
            type="message",
            data={"role": "user", "content": [{"type": "input_text", "text": 'é "q"\n'}]},
            created_by=None,
        )

    ours = item("item_mine")
    with django_assert_num_queries(1):
        insert_row(ours)
    assert ours.seq is not None and Item.objects.get(seq=ours.seq).id == "item_mine"
    unsaved = item("item_orm")
    created = Item.objects.create(
        **{
            field.attname: getattr(unsaved, field.attname)
            for field in Item._meta.concrete_fields
            if not field.primary_key
        }
    )
    assert created.seq == ours.seq + 1  # the same sequence, one after the other
    different = {"seq", "id", "created_at"}
    assert {
        k: v for k, v in field_values(Item.objects.get(seq=ours.seq)).items() if k not in different
    } == {k: v for k, v in field_values(created).items() if k not in different}


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/sessions/conv_1", "session-detail"),
        ("/v1/sessions/conv_1/events", "session-events"),
        ("/v1/sessions/updates", "session-updates"),
    ],
)
def test_the_hottest_routes_are_tried_first(path: str, name: str) -> None:
    """The snapshot and the message ``POST`` resolve in the URLconf's first ``include``
    (the first routes of api/urls.py), so no other route list is tried on the way; and
    ``sessions/updates`` is not taken for a session id."""
    from django.urls import get_resolver

    first = get_resolver().url_patterns[0]
    assert first.resolve(path.lstrip("/")).url_name == name


def test_the_routes_after_the_hottest_still_resolve() -> None:
    from django.urls import resolve

    assert resolve("/v1/sessions").url_name == "session-list"
    assert resolve("/v1/sessions/conv_1/items").url_name == "session-items"
    assert resolve("/v1/sessions/conv_1/policies").url_name == "session-policies"
    assert resolve("/v1/runners/r_1").url_name == "runner-detail"


def test_any_waiting_reads_what_the_queryset_reads(session: Session) -> None:
    """``scheduler.any_waiting`` (plain SQL, asked after every turn's end) answers as the
    queryset it replaced, whatever turns the table holds."""
    from runners import scheduler

    def orm() -> bool:
        return Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__isnull=True).exists()

    assert scheduler.any_waiting() is orm() is False
    dispatched = Turn.objects.create(session=session)  # queued, and sent to the runner
    running = Turn.objects.create(
        session=session, status=Turn.Status.IN_PROGRESS, dispatched_at=None
    )
    assert scheduler.any_waiting() is orm() is False
    waiting = Turn.objects.create(session=session, dispatched_at=None)
    assert scheduler.any_waiting() is orm() is True
    Turn.objects.filter(pk=waiting.pk).update(dispatched_at=timezone.now())
    assert scheduler.any_waiting() is orm() is False
    assert dispatched.pk and running.pk


def test_any_waiting_reads_the_partial_index_on_sqlite() -> None:
    """The status is written into the statement, not bound, so SQLite can use the partial
    index ``turn_waiting`` (a bound value cannot be proven to match its condition)."""
    from runners.scheduler import _any_waiting_sql

    if connection.vendor != "sqlite":
        pytest.skip("the query plan checked here is SQLite's; this run uses " + connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + _any_waiting_sql())
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "turn_waiting" in plan, plan
