"""drf-spectacular extensions: the project's authentication classes and its response shapes.

Response shapes are ``TypedDict`` classes (see ``omnigent_site/shapes.py``): the view
renders one with a plain function and documents it with
``@extend_schema(responses={200: SomeShape})``. ``TypedDictShapes`` below is an
``OpenApiSerializerExtension`` (drf-spectacular's public hook for objects that are not
DRF serializers, the same one its pydantic support uses) that turns such a class into a
schema component, so a shape's fields are listed only in its class.

Mapping rules:

- a shape is a component named after its class, with its docstring as description;
  a field another shape provides is a ``$ref`` to that shape's component;
- ``X | None`` is nullable; ``NotRequired[...]`` leaves the key out of ``required``;
- ``Literal[...]`` and ``Annotated[str, SomeChoices]`` (a Django ``TextChoices`` or any
  ``Enum``) become enum components, named after the shape that declares the field (or
  after the choices class), so a subclass or a second list reuses one component instead
  of tripping drf-spectacular's enum-naming collision warning;
- ``Annotated[..., Doc("...")]`` adds a description;
- generic shapes (``CursorPage[T]``) are documented through a named subclass
  (``class AgentPage(CursorPage[AgentOut])``), which binds ``T``;
- ``@allows_extra_keys`` documents ``additionalProperties: true``; every other shape
  lists all of its keys (the conformance test holds responses to that).
"""

from __future__ import annotations

import enum
import re
import types
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.plumbing import ComponentIdentity, ResolvedComponent
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from typing_extensions import (
    Doc,
    get_original_bases,
    get_type_hints,
    is_typeddict,
)

from .pagination import MAX_LIMIT
from .shapes import ErrorBody

# --- authentication -----------------------------------------------------------------


class ForwardedHeaderScheme(OpenApiAuthenticationExtension):
    target_class = "omnigent_site.authentication.ForwardedHeaderAuthentication"
    name = "forwardedHeader"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": settings.OMNIGENT_AUTH_HEADER or "X-Forwarded-Email",
            "description": "The user's identity, set by an authenticating proxy.",
        }


class LocalSingleUserScheme(OpenApiAuthenticationExtension):
    target_class = "omnigent_site.authentication.LocalSingleUserAuthentication"
    name = "localSingleUser"
    optional = True

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "none",
            "description": "Local single-user mode: requests without identity act as 'local'.",
        }


# --- response shapes ----------------------------------------------------------------


class _TypedDictClasses(type):
    def __subclasscheck__(cls, subclass: Any) -> bool:
        return is_typeddict(subclass)


class AnyTypedDict(metaclass=_TypedDictClasses):
    """Stands for every ``TypedDict`` class in drf-spectacular's extension lookup.

    The lookup asks ``issubclass(target, target_class)``; a ``TypedDict`` has no useful
    base class (its MRO is ``dict``), so the check is made by the metaclass.
    """


Field = tuple[Any, type, dict[Any, tuple[Any, type]]]


def shape_fields(shape: type) -> dict[str, Field]:
    """Each field of ``shape`` in declaration order: its type, the shape that declares
    it, and the bindings of the type variables it may use.

    ``TypedDict`` flattens inherited keys into ``__annotations__``; the declaring shape
    is found through ``__orig_bases__`` (set by ``typing_extensions.TypedDict``).
    """
    found: dict[str, Field] = {}
    _collect(shape, {}, found)
    return {name: found[name] for name in shape.__annotations__}


def _collect(shape: type, bindings: dict[Any, tuple[Any, type]], found: dict[str, Field]) -> None:
    inherited: set[str] = set()
    for base in get_original_bases(shape):
        origin = get_origin(base) or base
        if not is_typeddict(origin):
            continue  # TypedDict itself, Generic[T]
        base_bindings: dict[Any, tuple[Any, type]] = {}
        for parameter, argument in zip(
            getattr(origin, "__parameters__", ()), get_args(base), strict=False
        ):
            if isinstance(argument, TypeVar) and argument in bindings:
                base_bindings[parameter] = bindings[argument]
            else:
                base_bindings[parameter] = (argument, shape)
        _collect(origin, base_bindings, found)
        inherited.update(origin.__annotations__)
    for name, hint in get_type_hints(shape, include_extras=True).items():
        if name not in inherited:
            found[name] = (hint, shape, bindings)


def _is_required(hint: Any, *, total: bool) -> bool:
    """Read from the type, not ``__required_keys__``: under ``from __future__ import
    annotations`` Python 3.11 cannot see ``NotRequired`` when it builds the class."""
    while get_origin(hint) in (Annotated, NotRequired, Required):
        if get_origin(hint) is NotRequired:
            return False
        if get_origin(hint) is Required:
            return True
        hint = hint.__origin__ if get_origin(hint) is Annotated else get_args(hint)[0]
    return total


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", text))


def _json_type(values: list[Any]) -> str:
    if all(isinstance(value, bool) for value in values):
        return "boolean"
    if all(isinstance(value, int) for value in values):
        return "integer"
    return "string"


class ShapeMapper:
    """Builds the OpenAPI schema of one shape; nested shapes become ``$ref``s."""

    def __init__(self, auto_schema: Any, direction: Any) -> None:
        self.auto_schema = auto_schema
        self.direction = direction

    def object_schema(self, shape: type) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for name, (hint, owner, bindings) in shape_fields(shape).items():
            properties[name] = self.field_schema(hint, owner=owner, field=name, bindings=bindings)
        schema: dict[str, Any] = {"type": "object"}
        doc = shape.__dict__.get("__doc__")
        if doc:
            schema["description"] = " ".join(doc.split())
        schema["properties"] = properties
        required = [
            name
            for name, (hint, _, _) in shape_fields(shape).items()
            if _is_required(hint, total=getattr(shape, "__total__", True))
        ]
        if required:
            schema["required"] = required
        if getattr(shape, "__allows_extra_keys__", False):
            schema["additionalProperties"] = True
        return schema

    def field_schema(
        self, hint: Any, *, owner: type, field: str, bindings: dict[Any, tuple[Any, type]]
    ) -> dict[str, Any]:
        description = None
        choices: type[enum.Enum] | None = None
        while get_origin(hint) in (Annotated, NotRequired, Required):
            if get_origin(hint) is Annotated:
                for meta in hint.__metadata__:
                    if isinstance(meta, Doc):
                        description = meta.documentation
                    elif isinstance(meta, type) and issubclass(meta, enum.Enum):
                        choices = meta
                hint = hint.__origin__
            else:
                hint = get_args(hint)[0]
        if isinstance(hint, TypeVar):
            if hint not in bindings:
                raise TypeError(f"{owner.__name__}.{field}: unbound type variable {hint}")
            hint, owner = bindings[hint]
            bindings = {}
        schema = self._type_schema(
            hint, owner=owner, field=field, bindings=bindings, choices=choices
        )
        if description:
            schema = self._with(schema, description=description)
        return schema

    def _type_schema(
        self,
        hint: Any,
        *,
        owner: type,
        field: str,
        bindings: dict[Any, tuple[Any, type]],
        choices: type[enum.Enum] | None,
    ) -> dict[str, Any]:
        origin, args = get_origin(hint), get_args(hint)
        if origin in (Union, types.UnionType):
            present = [arg for arg in args if arg is not type(None)]
            if len(present) != 1 or len(present) == len(args):
                raise TypeError(f"{owner.__name__}.{field}: only `X | None` unions are mapped")
            inner = self.field_schema(
                Annotated[present[0], choices] if choices else present[0],
                owner=owner,
                field=field,
                bindings=bindings,
            )
            return self._with(inner, nullable=True)
        if choices is not None:
            values = [member.value for member in choices]
            return self._enum(f"{_camel(choices.__qualname__)}Enum", values)
        if origin is Literal:
            return self._enum(f"{owner.__name__}{_camel(field)}Enum", list(args))
        if hint is Any or hint is object:
            return {}
        if hint is bool:
            return {"type": "boolean"}
        if hint is int:
            return {"type": "integer"}
        if hint is float:
            return {"type": "number"}
        if hint is str:
            return {"type": "string"}
        if origin is list:
            item = self.field_schema(args[0], owner=owner, field=field, bindings=bindings)
            return {"type": "array", "items": item}
        if origin is dict:
            value: Any = {}
            if args and args[1] is not Any:
                value = self.field_schema(args[1], owner=owner, field=field, bindings=bindings)
            return {"type": "object", "additionalProperties": value}
        if is_typeddict(hint):
            return dict(self.auto_schema.resolve_serializer(hint, self.direction).ref)
        if is_typeddict(origin):
            raise TypeError(
                f"{owner.__name__}.{field}: name the generic shape {hint!r} with a subclass"
            )
        raise TypeError(f"{owner.__name__}.{field}: no OpenAPI mapping for {hint!r}")

    def _enum(self, name: str, values: list[Any]) -> dict[str, Any]:
        component = ResolvedComponent(
            name=name,
            type=ResolvedComponent.SCHEMA,
            schema={"type": _json_type(values), "enum": values},
            object=ComponentIdentity(tuple(values)),
        )
        self.auto_schema.registry.register_on_missing(component)
        return dict(component.ref)

    @staticmethod
    def _with(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """``schema`` plus keywords; a ``$ref`` is wrapped, since OpenAPI 3.0 ignores its siblings."""
        if "$ref" in schema:
            return {"allOf": [schema], **extra}
        return {**schema, **extra}


class TypedDictShapes(OpenApiSerializerExtension):
    """Lets ``@extend_schema(responses=...)`` take a ``TypedDict`` shape."""

    target_class = AnyTypedDict
    match_subclasses = True

    def get_name(self, auto_schema: Any, direction: Any) -> str:
        return str(self.target.__name__)

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return ShapeMapper(auto_schema, direction).object_schema(self.target)


class EventStream:
    """The ``text/event-stream`` body of an SSE operation, for ``@extend_schema``.

    OpenAPI 3.0 has no schema for a whole stream, so ``frame`` (a schema) describes one
    frame's fields, ``event``, ``id`` and ``data``: what schemathesis validates every
    frame it reads against. ``data`` is JSON in a string, so the payloads cannot be its
    schema; ``events`` maps each event type to the ``TypedDict`` of its payload, each
    becomes a component, and ``data`` names them by type in ``x-events``.
    """

    def __init__(self, name: str, *, frame: dict[str, Any], events: dict[str, type]) -> None:
        self.name = name
        self.frame = frame
        self.events = events


class EventStreamFrames(OpenApiSerializerExtension):
    """Documents an ``EventStream`` as a frame component that refers to its payloads."""

    target_class = EventStream

    def get_name(self, auto_schema: Any, direction: Any) -> str:
        return str(self.target.name)

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        stream: EventStream = self.target
        payloads = {
            kind: dict(auto_schema.resolve_serializer(shape, direction).ref)
            for kind, shape in stream.events.items()
        }
        properties = dict(stream.frame["properties"])
        properties["data"] = {**properties["data"], "x-events": payloads}
        return {**stream.frame, "properties": properties}


# --- operation helpers --------------------------------------------------------------

ERROR_DESCRIPTIONS = {
    400: "Invalid input (`invalid_input`); `fields` names the fields when known.",
    401: "No identity (`unauthorized`).",
    403: "The caller's access is too low (`forbidden`); the message names the level needed.",
    404: "Not found, or not visible to the caller (`not_found`).",
    409: "Conflicts with the current state (`conflict`).",
    413: "The request body or an upload is too large (`payload_too_large`).",
    415: "The request's Content-Type is not accepted (`unsupported_media_type`).",
    429: "Too many requests or open streams (`rate_limited`); `Retry-After` says when to retry.",
    503: "No live runner took the command (`runner_unavailable`); safe to retry.",
}


def error_responses(*codes: int) -> dict[tuple[int, str], OpenApiResponse]:
    """The error responses an operation can return, all in the one error format.

    Keyed by ``(code, "application/json")``: an error is JSON even on an operation
    whose success is another media type (the SSE stream).
    """
    return {
        (code, "application/json"): OpenApiResponse(ErrorBody, description=ERROR_DESCRIPTIONS[code])
        for code in codes
    }


def list_parameters(*, default_limit: int, default_order: str) -> list[OpenApiParameter]:
    """``limit``, ``after``, ``before``, ``order`` of a cursor list (http-api.md, Lists)."""
    return [
        OpenApiParameter(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": default_limit},
            description=f"page size, 1 to {MAX_LIMIT}",
        ),
        OpenApiParameter("after", str, description="cursor: the id after which to start"),
        OpenApiParameter(
            "before", str, description="cursor: the id before which to stop (not with `after`)"
        ),
        OpenApiParameter(
            "order",
            {"type": "string", "enum": ["asc", "desc"], "default": default_order},
        ),
    ]


def document_rate_limits(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Postprocessing hook: every authenticated operation may answer 429.

    The per-user rate (``omnigent_site/throttling.py``) applies to every API view, so the
    429 is added here once instead of in each view's ``error_responses``. An operation
    is authenticated when it documents 401.
    """
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses") if isinstance(operation, dict) else None
            if not responses or "401" not in responses or "429" in responses:
                continue
            responses["429"] = {
                "description": ERROR_DESCRIPTIONS[429],
                "headers": {
                    "Retry-After": {
                        "schema": {"type": "integer", "minimum": 1},
                        "description": "seconds to wait before retrying",
                    }
                },
                "content": {"application/json": responses["401"]["content"]["application/json"]},
            }
    return result


def document_cross_site_refusals(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Postprocessing hook: every authenticated state change may answer 403 and 415.

    In header and local mode a request a browser marks as coming from another site is
    403 and a body that is not of a type the operation takes is 415, before the view
    runs (``omnigent_site/cross_site.py``), so both are added here once.
    """
    refusals = {
        "403": ERROR_DESCRIPTIONS[403] + " Also: a state change from a page of another site.",
        "415": ERROR_DESCRIPTIONS[415],
    }
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            responses = operation.get("responses") if isinstance(operation, dict) else None
            if method not in ("post", "put", "patch", "delete") or not responses:
                continue
            if "401" not in responses:
                continue
            for status, description in refusals.items():
                responses.setdefault(
                    status,
                    {
                        "description": description,
                        "content": {
                            "application/json": responses["401"]["content"]["application/json"]
                        },
                    },
                )
    return result
