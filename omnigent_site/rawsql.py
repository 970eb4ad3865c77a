"""Plain SQL for the lookups every request makes and the writes every turn makes.

Building an ORM query (joins, lookups, SQL compilation) costs several times more
than running it: about 0.4 ms against 0.1 ms for a one-row lookup on a small
machine, and each request makes two (who is calling, may they touch this
session). ``Manager.raw()`` skips the building and still returns model instances
with Django's field conversions (JSON, datetimes), so callers cannot tell the
difference. The SQL is built from model metadata, once per model and column.

``Manager.raw()`` still works out, on every call, which column is which field and
which conversions each needs (a third of a one-row read's time under load).
``rows()`` does that once per connection, model and column list and keeps the plan;
the instances it builds are the ones ``raw()`` builds (``tests/api/test_hot_lookups.py``
compares them for every model, so a Django that changes underneath fails there).

The writes (``insert_rows``, ``insert_row``, ``update_row``) likewise keep their
statements and send each value through the field's own conversions.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.db.models.constants import OnConflict
from django.db.models.expressions import Col

M = TypeVar("M", bound=Model)


def quoted(model: type[Model], field: str | None = None) -> str:
    """The quoted table name of ``model``, or the quoted column of its field ``field``."""
    if field is None:
        return connection.ops.quote_name(model._meta.db_table)
    column = getattr(model._meta.get_field(field), "column", None)
    if not isinstance(column, str):
        raise ValueError(f"{model.__name__}.{field} is not a column")
    return connection.ops.quote_name(column)


@functools.cache
def _row_by_sql(model: type[Model], field: str) -> str:
    return f"SELECT * FROM {quoted(model)} WHERE {quoted(model, field)} = %s"


def locking(sql: str, *, of: str | None = None) -> str:
    """``sql`` that locks the rows it reads until the transaction ends (``FOR UPDATE``,
    only of table alias ``of`` where the database can say so), where the database has
    row locks; SQLite's ``IMMEDIATE`` transactions already hold its write lock."""
    features = connection.features
    if not features.has_select_for_update:
        return sql
    if of is not None and features.has_select_for_update_of:
        return f"{sql} FOR UPDATE OF {of}"
    return f"{sql} FOR UPDATE"


def row_by(model: type[M], field: str, value: Any, *, for_update: bool = False) -> M | None:
    """The row whose unique ``field`` equals ``value``, or None; ``for_update`` locks it
    (``locking``)."""
    sql = _row_by_sql(model, field)
    return first_row(model, locking(sql) if for_update else sql, [value])


Converter = Callable[[Any, Col, BaseDatabaseWrapper], Any]


@dataclass(frozen=True, slots=True)
class _RowPlan:
    """How a row of one column list becomes an instance of one model."""

    init_names: tuple[str, ...]
    init_positions: tuple[int, ...]
    # Columns that are no field of the model become attributes (``AS caller_level``).
    annotations: tuple[tuple[str, int], ...]
    converters: tuple[tuple[int, tuple[Converter, ...], Col], ...]


# One cache per connection object (they are per thread): a backend's converters are
# bound to its connection's operations.
_plans: weakref.WeakKeyDictionary[BaseDatabaseWrapper, dict[tuple[Any, ...], _RowPlan]] = (
    weakref.WeakKeyDictionary()
)


def _plan(db: BaseDatabaseWrapper, model: type[Model], columns: tuple[str, ...]) -> _RowPlan:
    per_db = _plans.setdefault(db, {})
    key = (model, columns)
    plan = per_db.get(key)
    if plan is not None:
        return plan
    # What ``RawQuerySet.resolve_model_init_order`` and ``RawModelIterable`` work out.
    identifier = db.introspection.identifier_converter
    by_column: dict[str, Field[Any, Any]] = {
        identifier(field.column): field
        for field in model._meta.concrete_fields
        if field.column is not None
    }
    pk = model._meta.pk
    if pk is None or pk.column is None or identifier(pk.column) not in columns:
        raise ValueError(f"a row of {model.__name__} must include its primary key")
    init = [(column, field) for column, field in by_column.items() if column in columns]
    converters: list[tuple[int, tuple[Converter, ...], Col]] = []
    for position, column in enumerate(columns):
        field = by_column.get(column)
        if field is None:
            continue
        col = field.get_col(model._meta.db_table)
        found = [*db.ops.get_db_converters(col), *col.get_db_converters(db)]
        if found:
            converters.append((position, tuple(found), col))
    plan = _RowPlan(
        init_names=tuple(field.attname for _column, field in init),
        init_positions=tuple(columns.index(column) for column, _field in init),
        annotations=tuple(
            (column, position) for position, column in enumerate(columns) if column not in by_column
        ),
        converters=tuple(converters),
    )
    per_db[key] = plan
    return plan


@functools.cache
def joined_columns(model: type[Model], alias: str, name: str) -> str:
    """The select list of ``model``'s columns from the table aliased ``alias``, each
    named ``name__<column>``: how a joined row reaches ``rows(..., joined={name: model})``."""
    quote = connection.ops.quote_name
    return ", ".join(
        f"{alias}.{quote(field.column)} AS {quote(f'{name}__{field.column}')}"
        for field in model._meta.concrete_fields
        if field.column is not None
    )


@dataclass(frozen=True, slots=True)
class _SplitPlan:
    """Which columns of a joined row belong to the main model and to each joined one."""

    main_positions: tuple[int, ...]
    main: _RowPlan
    # (relation name, related model, its columns' positions, its plan, where its pk is
    # among those columns)
    joined: tuple[tuple[str, type[Model], tuple[int, ...], _RowPlan, int], ...]


def _split_plan(
    db: BaseDatabaseWrapper,
    model: type[Model],
    columns: tuple[str, ...],
    joined: tuple[tuple[str, type[Model]], ...],
) -> _SplitPlan:
    per_db = _split_plans.setdefault(db, {})
    key = (model, columns, joined)
    plan = per_db.get(key)
    if plan is not None:
        return plan
    taken: set[int] = set()
    parts = []
    for name, related in joined:
        prefix = f"{name}__"
        positions = tuple(i for i, column in enumerate(columns) if column.startswith(prefix))
        taken.update(positions)
        sub_columns = tuple(columns[i][len(prefix) :] for i in positions)
        related_plan = _plan(db, related, sub_columns)  # checks that the pk is selected
        pk_column = db.introspection.identifier_converter(str(related._meta.pk.column))  # type: ignore[union-attr]
        parts.append((name, related, positions, related_plan, sub_columns.index(pk_column)))
    main_positions = tuple(i for i in range(len(columns)) if i not in taken)
    plan = _SplitPlan(
        main_positions=main_positions,
        main=_plan(db, model, tuple(columns[i] for i in main_positions)),
        joined=tuple(parts),
    )
    per_db[key] = plan
    return plan


_split_plans: weakref.WeakKeyDictionary[BaseDatabaseWrapper, dict[tuple[Any, ...], _SplitPlan]] = (
    weakref.WeakKeyDictionary()
)


def _instance(db: BaseDatabaseWrapper, model: type[M], plan: _RowPlan, values: list[Any]) -> M:
    """One instance from one row's values, as ``RawModelIterable`` builds it."""
    for position, converters, col in plan.converters:
        value = values[position]
        for convert in converters:
            value = convert(value, col, db)
        values[position] = value
    instance = model.from_db(
        db.alias, list(plan.init_names), [values[position] for position in plan.init_positions]
    )
    for column, position in plan.annotations:
        setattr(instance, column, values[position])
    return instance


def rows(
    model: type[M],
    sql: str,
    params: Sequence[Any],
    *,
    joined: Mapping[str, type[Model]] | None = None,
) -> list[M]:
    """Instances of ``model`` from ``sql``, as ``model.objects.raw(sql, params)`` makes them.

    The query must select the model's primary key; other columns that are no field of
    the model are set as attributes of the same name.

    ``joined`` maps a forward relation of ``model`` (``"runner"``) to the related model,
    whose columns the query selects with ``joined_columns``: each instance then comes
    with that object cached, as ``select_related`` would give it, or None when the join
    found no row (its primary key column is NULL). One query instead of one per relation.
    """
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        identifier = db.introspection.identifier_converter
        columns = tuple(identifier(column[0]) for column in cursor.description)
        fetched = cursor.fetchall()
    if not fetched:
        return []
    if not joined:
        plan = _plan(db, model, columns)
        return [_instance(db, model, plan, list(fetched_row)) for fetched_row in fetched]
    split = _split_plan(db, model, columns, tuple(joined.items()))
    instances: list[M] = []
    for fetched_row in fetched:
        instance = _instance(db, model, split.main, [fetched_row[i] for i in split.main_positions])
        for name, related_model, positions, related_plan, pk_position in split.joined:
            values = [fetched_row[i] for i in positions]
            related = (
                None
                if values[pk_position] is None
                else _instance(db, related_model, related_plan, values)
            )
            # Assignment caches the related object, as ``select_related`` does.
            setattr(instance, name, related)
        instances.append(instance)
    return instances


def first_row(
    model: type[M],
    sql: str,
    params: Sequence[Any],
    *,
    joined: Mapping[str, type[Model]] | None = None,
) -> M | None:
    """The first instance ``rows()`` would return, or None."""
    found = rows(model, sql, params, joined=joined)
    return found[0] if found else None


@functools.cache
def _increment_sql(model: type[Model], field: str) -> str:
    column = quoted(model, field)
    pk = quoted(model, model._meta.pk.name)  # type: ignore[union-attr]
    return f"UPDATE {quoted(model)} SET {column} = {column} + %s WHERE {pk} = %s RETURNING {column}"


def increment_returning(model: type[Model], *, pk: Any, field: str, by: int) -> int | None:
    """Add ``by`` to the integer ``field`` of row ``pk`` and return the new value (None
    when there is no such row): one statement where the ORM needs an UPDATE and a read.

    The UPDATE takes the row's lock first, so concurrent callers queue and each reads
    back its own value. ``RETURNING`` is in PostgreSQL and in SQLite since 3.35.
    """
    with connection.cursor() as cursor:
        cursor.execute(_increment_sql(model, field), [by, pk])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


@functools.cache
def _generated_key(model: type[Model]) -> Field[Any, Any] | None:
    """The primary key when the database generates it (an ``AutoField``), else None."""
    pk = model._meta.pk
    return pk if pk is not None and getattr(pk, "db_returning", False) else None


@functools.cache
def _insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The fields an INSERT sends: every column but a database-generated key."""
    generated = _generated_key(model)
    return tuple(
        field
        for field in model._meta.concrete_fields
        if field.column is not None and field is not generated
    )


@functools.lru_cache(maxsize=256)  # one entry per model and row count seen
def _insert_sql(model: type[Model], rows_count: int) -> str:
    fields = _insert_fields(model)
    columns = ", ".join(connection.ops.quote_name(str(field.column)) for field in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    values = ", ".join([one] * rows_count)
    return f"INSERT INTO {quoted(model)} ({columns}) VALUES {values}"


def _row_values(
    db: BaseDatabaseWrapper,
    fields: Sequence[Field[Any, Any]],
    instance: Model,
    *,
    as_given: bool = False,
) -> list[Any]:
    """An INSERT's values of ``instance``, converted as the ORM's insert compiler does
    (``as_given``: without ``pre_save``, so ``auto_now_add`` keeps the value set)."""
    if as_given:
        return [field.get_db_prep_save(getattr(instance, field.attname), db) for field in fields]
    return [field.get_db_prep_save(field.pre_save(instance, True), db) for field in fields]


def insert_rows(model: type[M], instances: Sequence[M], *, as_given: bool = False) -> None:
    """Store new ``instances`` of ``model`` with one multi-row INSERT each batch, as
    ``bulk_create`` does, for callers that do not need the primary keys back.

    A key the database generates is not sent, and not set on the instances
    (``insert_row`` sets it); any other key is sent like the other fields. Each value
    goes through its field's ``pre_save`` (so ``auto_now_add`` applies) and
    ``get_db_prep_save``, the conversions the ORM's insert compiler makes;
    ``tests/api/test_hot_lookups.py`` compares the stored rows with ``bulk_create``'s
    for every field kind used here. ``as_given`` skips ``pre_save``: a copy keeps the
    timestamps it was given (an import's ``created_at``). What it skips is the compiler itself:
    ``bulk_create`` built the statement anew on every call, which cost more than
    running it for the few events of a runner batch.
    """
    if not instances:
        return
    db = connections[DEFAULT_DB_ALIAS]
    fields = _insert_fields(model)
    size = db.ops.bulk_batch_size(list(fields), list(instances)) or len(instances)
    with db.cursor() as cursor:
        for start in range(0, len(instances), size):
            chunk = instances[start : start + size]
            sql = _insert_sql(model, len(chunk))
            params: list[Any] = []
            for instance in chunk:
                params.extend(_row_values(db, fields, instance, as_given=as_given))
            cursor.execute(sql, params)
    for instance in instances:
        instance._state.adding = False
        instance._state.db = db.alias


@functools.cache
def _insert_row_sql(model: type[Model]) -> str:
    generated = _generated_key(model)
    sql = _insert_sql(model, 1)
    if generated is None:
        return sql
    return f"{sql} RETURNING {connection.ops.quote_name(str(generated.column))}"


def insert_row(instance: Model) -> None:
    """Store the new ``instance`` with one plain INSERT, as ``Model.objects.create`` does
    (without the model signals, which no model stored this way has receivers for): the
    values converted as ``insert_rows`` converts them, and a key the database generates
    read back with ``RETURNING`` (PostgreSQL; SQLite since 3.35) and set on the instance.

    A turn's POST stores two rows, and building each ORM INSERT cost about three times
    running it.
    """
    model = type(instance)
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(_insert_row_sql(model), _row_values(db, _insert_fields(model), instance))
        generated = _generated_key(model)
        if generated is not None:
            (key,) = cursor.fetchone()
            setattr(instance, generated.attname, key)
    instance._state.adding = False
    instance._state.db = db.alias


@functools.lru_cache(maxsize=256)  # one entry per model and field list seen
def _update_sql(model: type[Model], names: tuple[str, ...]) -> str:
    pk = quoted(model, model._meta.pk.name)  # type: ignore[union-attr]
    columns = ", ".join(f"{quoted(model, name)} = %s" for name in names)
    return f"UPDATE {quoted(model)} SET {columns} WHERE {pk} = %s"


def update_row(instance: Model, names: Sequence[str]) -> int:
    """Write the current values of the fields ``names`` of ``instance`` to its row, as
    ``Model.objects.filter(pk=instance.pk).update(...)`` with those values does; returns
    how many rows were updated.

    Each value goes through ``get_db_prep_save``, the conversion the ORM's update
    compiler makes (``tests/api/test_hot_lookups.py`` compares the rows with the ORM's).
    Like ``update()`` it sends no model signals and leaves ``auto_now`` to the caller.
    What it skips is building the statement: about 0.2 ms against 0.06 ms for running
    it, several times a turn.
    """
    model = type(instance)
    db = connections[DEFAULT_DB_ALIAS]
    params: list[Any] = []
    for name in names:
        field = model._meta.get_field(name)
        value = getattr(instance, field.attname)  # type: ignore[union-attr]
        if hasattr(value, "resolve_expression"):
            raise ValueError(f"{model.__name__}.{name}: update_row writes values, not expressions")
        params.append(field.get_db_prep_save(value, db))  # type: ignore[union-attr]
    params.append(instance.pk)
    with db.cursor() as cursor:
        cursor.execute(_update_sql(model, tuple(names)), params)
        return int(cursor.rowcount)


def update_rows(instances: Sequence[Model], names: Sequence[str]) -> None:
    """``update_row`` for many instances of one model: one statement run for every row
    (``executemany``). ``bulk_update`` builds a ``CASE WHEN`` per field and row, which for
    a batch of webhook deliveries cost more CPU than their HTTP requests."""
    if not instances:
        return
    model = type(instances[0])
    db = connections[DEFAULT_DB_ALIAS]
    fields = [model._meta.get_field(name) for name in names]
    params = [
        [field.get_db_prep_save(getattr(instance, field.attname), db) for field in fields]  # type: ignore[union-attr]
        + [instance.pk]
        for instance in instances
    ]
    with db.cursor() as cursor:
        cursor.executemany(_update_sql(model, tuple(names)), params)


@functools.lru_cache(maxsize=64)  # one entry per model, column list and conflict rule
def _values_insert_sql(model: type[Model], names: tuple[str, ...], ignore_conflicts: bool) -> str:
    ops = connection.ops
    columns = ", ".join(quoted(model, name) for name in names)
    placeholders = ", ".join(["%s"] * len(names))
    if not ignore_conflicts:
        return f"INSERT INTO {quoted(model)} ({columns}) VALUES ({placeholders})"
    fields = [model._meta.get_field(name) for name in names]
    head = ops.insert_statement(on_conflict=OnConflict.IGNORE)
    tail = ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None)
    return f"{head} {quoted(model)} ({columns}) VALUES ({placeholders}) {tail}".rstrip()


def insert_values(
    model: type[Model],
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    ignore_conflicts: bool = False,
) -> None:
    """Store rows of ``model`` given as values of the fields ``names`` (one statement run
    for every row), without building model instances: the fields not named must be
    nullable. Each value goes through its field's ``get_db_prep_save``, as the ORM's
    insert compiler does; ``ignore_conflicts`` as ``bulk_create``'s."""
    if not rows:
        return
    db = connections[DEFAULT_DB_ALIAS]
    fields = [model._meta.get_field(name) for name in names]
    params = [
        [field.get_db_prep_save(value, db) for field, value in zip(fields, row, strict=True)]  # type: ignore[union-attr]
        for row in rows
    ]
    with db.cursor() as cursor:
        cursor.executemany(_values_insert_sql(model, tuple(names), ignore_conflicts), params)
