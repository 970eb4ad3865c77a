"""Benchmark: the cost of typed tunnel frames on the relay path, per library.

Measures, for the hot frames of the tunnel (an ``event`` frame carrying a
``response.output_text.delta``, ``turn.start`` with 20 input items, ``tool_result``,
``ack`` and ``event.ack``), µs per frame to

* **decode**: JSON text → validated data, as the receiving side does it (the runner's
  frames through a decoder of every runner frame type, the server's through one of every
  server frame type), and
* **encode**: data → JSON text (``str``, as a WebSocket text message needs),

for four ways of doing it:

* ``json``: today's plain ``json.loads`` / ``json.dumps`` of dicts, no validation (the
  floor the typed versions are compared with);
* ``dataclasses``: ``json.loads`` plus one generic validation helper into dataclasses,
  and ``json.dumps`` of a shallow ``to_dict``;
* ``pydantic``: discriminated unions of ``BaseModel``s, ``validate_json`` / ``model_dump_json``
  (measured when pydantic is installed; the project does not depend on it);
* ``msgspec``: the project's own ``omnigent_runner.protocol`` (tagged ``Struct`` unions).

The models for ``dataclasses`` and ``pydantic`` are defined here with the same fields
and the same validation (types, ``seq >= 1``, extra keys ignored) as the protocol
module's, for the frames measured.

Run: ``.venv/bin/python -m bench.protocol [--repeat 7]``. The last line printed is JSON
with every number.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import timeit
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from bench._common import env_summary
from omnigent_runner import protocol

# ----------------------------------------------------------------------- sample frames

SESSION = "conv_5f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5"
RESPONSE = "resp_0a1b2c3d4e5f60718293a4b5c6d7e8f9"


def _item(index: int) -> dict[str, Any]:
    role = "user" if index % 2 == 0 else "assistant"
    part = "input_text" if role == "user" else "output_text"
    return {
        "id": f"item_{index:032x}",
        "type": "message",
        "status": "completed",
        "role": role,
        "content": [{"type": part, "text": f"message {index}: " + "lorem ipsum dolor " * 10}],
        "response_id": RESPONSE,
        "created_at": 1718000000 + index,
        "created_by": "alice@example.com" if role == "user" else None,
    }


FRAMES: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (direction the frame travels, the frame as today's dicts)
    "event(delta)": (
        "runner",
        {
            "type": "event",
            "session_id": SESSION,
            "seq": 4242,
            "event": {
                "type": "response.output_text.delta",
                "response_id": RESPONSE,
                "item_id": "item_" + "7" * 32,
                "delta": "Hello, wor",
            },
        },
    ),
    "turn.start(20 items)": (
        "server",
        {
            "type": "turn.start",
            "id": "cmd-3-17",
            "session_id": SESSION,
            "response_id": RESPONSE,
            "input": [_item(i) for i in range(20)],
            "tools": [{"type": "function", "name": "pick", "parameters": {"type": "object"}}],
        },
    ),
    "tool_result": (
        "server",
        {
            "type": "tool_result",
            "id": "cmd-3-18",
            "session_id": SESSION,
            "call_id": "call_" + "a" * 24,
            "output": '{"temperature": 21, "unit": "C"}',
        },
    ),
    "ack": ("runner", {"type": "ack", "id": "cmd-3-18"}),
    "event.ack": ("server", {"type": "event.ack", "session_id": SESSION, "seq": 4242}),
}


# --------------------------------------------------------------- dataclasses + one helper


class Invalid(ValueError):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcDelta:
    type: Literal["response.output_text.delta"]
    response_id: str
    item_id: str
    delta: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcStatus:
    type: Literal["session.status"]
    status: Literal["running", "waiting", "idle", "failed"]
    response_id: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcEvent:
    type: Literal["event"]
    session_id: str
    seq: int
    event: DcDelta | DcStatus

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise Invalid("seq must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcAck:
    type: Literal["ack"]
    id: str | int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcTurnStart:
    type: Literal["turn.start"]
    session_id: str
    response_id: str
    id: str | int | None = None
    input: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcToolResult:
    type: Literal["tool_result"]
    session_id: str
    call_id: str
    id: str | int | None = None
    output: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DcEventAck:
    type: Literal["event.ack"]
    session_id: str
    seq: int


_DC_RUNNER = {"event": DcEvent, "ack": DcAck}
_DC_SERVER = {"turn.start": DcTurnStart, "tool_result": DcToolResult, "event.ack": DcEventAck}
_DC_EVENTS = {"response.output_text.delta": DcDelta, "session.status": DcStatus}
_HINTS: dict[type, dict[str, Any]] = {}


def _check(value: Any, hint: Any) -> Any:
    """The one validation helper: ``value`` must match ``hint`` (returns it converted)."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise Invalid(f"{value!r} is not one of {typing.get_args(hint)}")
        return value
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if dataclasses.is_dataclass(options[0]) and isinstance(value, dict):
            return _from_dict(_DC_EVENTS, value)
        for option in options:
            try:
                return _check(value, option)
            except Invalid:
                continue
        raise Invalid(f"{value!r} is not a {hint}")
    if origin is list:
        if not isinstance(value, list):
            raise Invalid("expected a list")
        (inner,) = typing.get_args(hint)
        return value if inner is Any else [_check(v, inner) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid("expected an object")
        return value
    if hint is type(None):
        if value is not None:
            raise Invalid("expected null")
        return value
    if hint is int and isinstance(value, bool):
        raise Invalid("expected an int")
    if not isinstance(value, hint):
        raise Invalid(f"expected {hint.__name__}")
    return value


def _from_dict(classes: dict[str, Any], data: Any) -> Any:
    if not isinstance(data, dict):
        raise Invalid("a frame must be an object")
    cls = classes.get(data.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise Invalid(f"unknown type {data.get('type')!r}")
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    kwargs = {}
    for name, hint in hints.items():
        if name in data:
            kwargs[name] = _check(data[name], hint)
    return cls(**kwargs)


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


# ------------------------------------------------------------------------------ pydantic

try:
    import pydantic
except ImportError:  # only a point of comparison: the project does not depend on it
    pydantic = None  # type: ignore[assignment]


def _pydantic_adapters() -> tuple[Any, Any]:
    """Adapters for each direction's frames (defined here so pydantic stays optional)."""
    assert pydantic is not None

    class _Model(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="ignore", frozen=True, strict=True)

    class PdDelta(_Model):
        type: Literal["response.output_text.delta"]
        response_id: str
        item_id: str
        delta: str

    class PdStatus(_Model):
        type: Literal["session.status"]
        status: Literal["running", "waiting", "idle", "failed"]
        response_id: str | None = None

    class PdEvent(_Model):
        type: Literal["event"]
        session_id: str
        seq: Annotated[int, pydantic.Field(ge=1)]
        event: Annotated[PdDelta | PdStatus, pydantic.Field(discriminator="type")]

    class PdAck(_Model):
        type: Literal["ack"]
        id: str | int

    class PdTurnStart(_Model):
        type: Literal["turn.start"]
        id: str | int | None = None
        session_id: str
        response_id: str
        input: list[dict[str, Any]] = []
        tools: list[dict[str, Any]] = []

    class PdToolResult(_Model):
        type: Literal["tool_result"]
        id: str | int | None = None
        session_id: str
        call_id: str
        output: Any = None

    class PdEventAck(_Model):
        type: Literal["event.ack"]
        session_id: str
        seq: int

    runner = pydantic.TypeAdapter(Annotated[PdEvent | PdAck, pydantic.Field(discriminator="type")])
    server = pydantic.TypeAdapter(
        Annotated[PdTurnStart | PdToolResult | PdEventAck, pydantic.Field(discriminator="type")]
    )
    return runner, server


_PD_ADAPTERS = _pydantic_adapters() if pydantic is not None else None


# ----------------------------------------------------------------------------- harness


Codec = tuple[Callable[[str], Any], Callable[[Any], str]]


def codecs(direction: str) -> dict[str, Codec]:
    """Per library: (decode text → data, encode data → text) for one direction."""
    dc_classes = _DC_RUNNER if direction == "runner" else _DC_SERVER
    msgspec_decode: Callable[[str], Any] = (
        protocol.decode_runner_frame if direction == "runner" else protocol.decode_server_frame
    )
    result: dict[str, Codec] = {
        "json": (json.loads, json.dumps),
        "dataclasses": (
            lambda text: _from_dict(dc_classes, json.loads(text)),
            lambda obj: json.dumps(_to_dict(obj)),
        ),
    }
    if _PD_ADAPTERS is not None:
        adapter = _PD_ADAPTERS[0] if direction == "runner" else _PD_ADAPTERS[1]
        result["pydantic"] = (adapter.validate_json, lambda obj: obj.model_dump_json())
    result["msgspec"] = (msgspec_decode, protocol.encode)
    return result


def per_call_us(fn: Callable[[], Any], repeat: int) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(number, 1)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def measure(repeat: int) -> dict[str, dict[str, dict[str, float]]]:
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, (direction, frame) in FRAMES.items():
        text = json.dumps(frame)
        results[name] = {}
        for library, (decode, encode) in codecs(direction).items():
            data = decode(text)
            # Sanity: the typed value writes the same frame back.
            if json.loads(encode(data)) != json.loads(text):
                raise RuntimeError(f"{library} does not round-trip {name}")
            results[name][library] = {
                "decode_us": round(per_call_us(functools.partial(decode, text), repeat), 3),
                "encode_us": round(per_call_us(functools.partial(encode, data), repeat), 3),
            }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing rounds (the best counts)")
    args = parser.parse_args()
    results = measure(args.repeat)
    libraries = list(next(iter(results.values())))
    if pydantic is None:
        print("(pydantic is not installed: its column is left out)")
    print(f"µs per frame (best of {args.repeat}); decode = parse + validate, encode = to text")
    header = f"{'frame':<22}" + "".join(f"{lib:>24}" for lib in libraries)
    print(header)
    print(f"{'':<22}" + "".join(f"{'decode / encode':>24}" for _ in libraries))
    for name, per_library in results.items():
        cells = "".join(
            f"{per_library[lib]['decode_us']:>12.2f} /{per_library[lib]['encode_us']:>9.2f}"
            for lib in libraries
        )
        print(f"{name:<22}{cells}")
    print(json.dumps({"bench": "protocol", **env_summary(), "us_per_frame": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
