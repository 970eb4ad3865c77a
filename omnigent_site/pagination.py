"""Cursor lists (http-api.md, Lists): ``limit``, ``after``, ``before``, ``order``.

Cursors are object ids. Pages are keyset queries on (sort field, primary key), so a
page costs the same wherever it is in a long list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet
from rest_framework.exceptions import ValidationError

from .shapes import CursorPage

MAX_LIMIT = 1000

Row = TypeVar("Row")


@dataclass(frozen=True)
class ListParams:
    limit: int
    order: str
    after: str | None
    before: str | None


def parse_list_params(
    query: Mapping[str, str], *, default_limit: int = 20, default_order: str = "desc"
) -> ListParams:
    raw_limit = query.get("limit")
    limit = default_limit
    if raw_limit not in (None, ""):
        try:
            limit = int(str(raw_limit))
        except ValueError:
            raise ValidationError({"limit": [f"must be an integer, got {raw_limit!r}"]}) from None
        if not 1 <= limit <= MAX_LIMIT:
            raise ValidationError({"limit": [f"must be between 1 and {MAX_LIMIT}"]})
    order = (query.get("order") or default_order).lower()
    if order not in ("asc", "desc"):
        raise ValidationError({"order": ["must be 'asc' or 'desc'"]})
    after = query.get("after") or None
    before = query.get("before") or None
    if after and before:
        raise ValidationError({"after": ["give 'after' or 'before', not both"]})
    return ListParams(limit=limit, order=order, after=after, before=before)


@dataclass(frozen=True)
class Page:
    objects: list[Any]
    has_more: bool

    def body(self, render: Callable[[Any], Row], id_of: Callable[[Any], str]) -> CursorPage[Row]:
        """The list envelope (``omnigent_site.shapes.CursorPage``) with one rendered row per object."""
        data = [render(obj) for obj in self.objects]
        return {
            "object": "list",
            "data": data,
            "first_id": id_of(self.objects[0]) if self.objects else None,
            "last_id": id_of(self.objects[-1]) if self.objects else None,
            "has_more": self.has_more,
        }


def _beyond(sort_field: str, pk_field: str, values: tuple[Any, Any], *, greater: bool) -> Q:
    op = "gt" if greater else "lt"
    sort_value, pk_value = values
    if sort_field == pk_field:
        return Q(**{f"{pk_field}__{op}": pk_value})
    return Q(**{f"{sort_field}__{op}": sort_value}) | Q(
        **{sort_field: sort_value, f"{pk_field}__{op}": pk_value}
    )


def paginate(
    queryset: QuerySet[Model],
    params: ListParams,
    *,
    sort_field: str,
    cursor_field: str = "pk",
) -> Page:
    """One page of ``queryset`` in ``params.order`` of (``sort_field``, pk).

    ``cursor_field`` names the field that holds the public id given in ``after``
    and ``before``; an unknown cursor is a 400, not an empty page.
    """
    pk_field = queryset.model._meta.pk.name
    ascending = params.order == "asc"
    cursor = params.after or params.before
    if cursor:
        values = queryset.filter(**{cursor_field: cursor}).values_list(sort_field, pk_field).first()
        if values is None:
            which = "after" if params.after else "before"
            raise ValidationError({which: [f"unknown cursor {cursor!r}"]})
        # 'after' walks on in the listed order; 'before' walks back against it.
        greater = ascending if params.after else not ascending
        queryset = queryset.filter(_beyond(sort_field, pk_field, values, greater=greater))
    walk_ascending = ascending if not params.before else not ascending
    prefix = "" if walk_ascending else "-"
    rows = list(
        queryset.order_by(f"{prefix}{sort_field}", f"{prefix}{pk_field}")[: params.limit + 1]
    )
    has_more = len(rows) > params.limit
    rows = rows[: params.limit]
    if params.before:
        rows.reverse()
    return Page(objects=rows, has_more=has_more)
