"""Response shapes shared by every app: the error format and the list envelopes.

A response shape is a ``TypedDict``: its fields are listed once, the function that
renders it is type-checked against it, and ``omnigent_site.schema`` turns the same class
into the OpenAPI component (``@extend_schema(responses=SomeShape)``). Shape modules
import no DRF and no drf-spectacular, so the domain layer (services, runner events,
held DRF-free by the import contracts) renders stream payloads with the same shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, NotRequired, TypeVar

from typing_extensions import Doc, TypedDict

T = TypeVar("T")
ShapeClass = TypeVar("ShapeClass", bound=type)


def allows_extra_keys(shape: ShapeClass) -> ShapeClass:
    """Marks a shape whose objects carry more keys than it lists (a flat item's own fields).

    ``TypedDict`` cannot say so before PEP 728 (``extra_items``), which mypy does not
    read yet; the schema documents such a shape with ``additionalProperties: true``.
    """
    shape.__allows_extra_keys__ = True  # type: ignore[attr-defined]
    return shape


# --- errors (http-api.md, Errors) -------------------------------------------------------


class ErrorInfo(TypedDict):
    """What went wrong: a stable code for programs and a message for people."""

    code: str
    message: str


class ErrorDetail(ErrorInfo):
    """The ``error`` member of an error response."""

    fields: NotRequired[Annotated[dict[str, Any], Doc("per-field messages of a validation error")]]


class ErrorBody(TypedDict):
    """Every 4xx/5xx body."""

    error: ErrorDetail


# --- lists (http-api.md, Lists) ---------------------------------------------------------


class ObjectList(TypedDict, Generic[T]):
    """A list without cursors."""

    object: Literal["list"]
    data: list[T]


class CursorPage(ObjectList[T]):
    """One page of a cursor list (``limit``, ``after``, ``before``, ``order``)."""

    first_id: Annotated[str | None, Doc("cursor for `before`; null on an empty page")]
    last_id: Annotated[str | None, Doc("cursor for `after`; null on an empty page")]
    has_more: bool
