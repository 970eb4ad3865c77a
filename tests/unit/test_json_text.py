"""The one JSON path (omnigent_runner/json_text.py) and the tunnel decoders built on it.

Deep nesting and lone surrogates are refused with a message (never a ``RecursionError``
or a string that cannot be encoded later); a frame that nests too deep is a
``ProtocolError`` that still names its ``type`` and ``id`` so the receiver can answer it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest

from omnigent_runner import json_text
from omnigent_runner import protocol as p


def nested(depth: int, leaf: str = "1") -> str:
    """JSON text of ``depth`` levels: arrays and objects taking turns."""
    text = leaf
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k{level}": {text}}}'
    return text


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(item) for item in value), default=0)
    return 0


def random_value(rng: random.Random, budget: int) -> Any:
    kind = rng.randrange(6 if budget > 0 else 3)
    if kind == 0:
        return rng.choice(['a"]', "{[}", "\\", 'x\\"[', "", "é€"])
    if kind == 1:
        return rng.randint(-5, 5)
    if kind == 2:
        return rng.choice([None, True, 1.5])
    if kind in (3, 4):
        return [random_value(rng, budget - 1) for _ in range(rng.randrange(3))]
    return {f"k{i}[": random_value(rng, budget - 1) for i in range(rng.randrange(3))}


def test_nesting_depth_matches_a_reference_walk_on_random_json() -> None:
    """Brackets inside strings (and escaped quotes before them) do not count."""
    rng = random.Random(15)
    for _ in range(500):
        value = random_value(rng, rng.randrange(12))
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
            assert json_text.nesting_depth(text) == reference_depth(value), text
            assert json_text.nesting_depth(text.encode()) == reference_depth(value), text


@pytest.mark.parametrize("depth", [1, 63, 64])
def test_up_to_the_limit_is_parsed(depth: int) -> None:
    assert reference_depth(json_text.loads(nested(depth), max_depth=64)) == depth


@pytest.mark.parametrize("depth", [65, 990, 5000, 100_000])
def test_deeper_than_the_limit_is_refused_with_a_message(depth: int) -> None:
    with pytest.raises(json_text.JsonTextError, match="nesting deeper than 64 levels"):
        json_text.loads(nested(depth), max_depth=64)
    with pytest.raises(json_text.JsonTextError, match="nesting deeper than 64 levels"):
        json_text.loads(nested(depth).encode(), max_depth=64)


def test_the_limit_is_the_callers() -> None:
    json_text.loads(nested(8), max_depth=8)
    with pytest.raises(json_text.JsonTextError, match="deeper than 8 levels"):
        json_text.loads(nested(9), max_depth=8)


@pytest.mark.parametrize(
    "text",
    ['"\\ud800"', '{"\\udfff": 1}', '["a\\ud83d"]', '"\\ude00x"', '{"k": "\\uDBFF\\u0041"}'],
)
def test_lone_surrogates_are_refused_by_name(text: str) -> None:
    with pytest.raises(json_text.JsonTextError, match="lone surrogate"):
        json_text.loads(text)


def test_a_surrogate_pair_is_one_character() -> None:
    assert json_text.loads('"\\ud83d\\ude00"') == "\U0001f600"


# Overlong "/", an encoded surrogate, a truncated sequence, a lone continuation byte.
NOT_UTF8 = [b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xff\xfe\xc3("]


@pytest.mark.parametrize("raw", NOT_UTF8)
def test_text_that_is_not_utf8_is_refused_with_the_byte_and_its_offset(raw: bytes) -> None:
    """msgspec raises ``UnicodeDecodeError`` for these (not its ``DecodeError``): it was
    a 500 on every JSON endpoint."""
    text = b'{"title": "' + raw + b'"}'
    with pytest.raises(json_text.JsonTextError) as refused:
        json_text.loads(text)
    message = str(refused.value)
    assert "not UTF-8" in message
    assert f"byte 0x{raw[0]:02x} at offset 11" in message
    message.encode("utf-8")


def test_a_str_holding_a_raw_surrogate_is_refused() -> None:
    with pytest.raises(json_text.JsonTextError, match="lone surrogate"):
        json_text.loads('{"title": "\udcc0"}')


@pytest.mark.parametrize("raw", NOT_UTF8)
def test_frames_that_are_not_utf8_are_malformed_both_ways(raw: bytes) -> None:
    frames = [
        b'{"type": "ack", "id": "' + raw + b'"}',
        b'{"type": "event", "session_id": "s", "seq": 1, "event": {"type": "x", "t": "'
        + raw
        + b'"}}',
    ]
    for frame in [*frames, frames[0].decode("utf-8", "surrogateescape")]:
        for decode in (p.decode_runner_frame, p.decode_server_frame):
            with pytest.raises(p.ProtocolError) as refused:
                decode(frame)
            assert refused.value.code == p.MALFORMED
            assert "UTF-8" in refused.value.message


def test_a_too_deep_frame_that_is_not_utf8_is_still_an_error_not_a_crash() -> None:
    """The too-deep path reads the frame's top level again, to name its type and id."""
    text = '{"type": "event", "id": "\udcc0", "session_id": "s", "seq": 1, "event": '
    text += nested(300) + "}"
    with pytest.raises(p.ProtocolError):
        p.decode_server_frame(text)
    with pytest.raises(p.ProtocolError):
        p.decode_runner_frame(text)


@pytest.mark.parametrize(
    "text", ["NaN", "[Infinity]", "1e400", "1" * 5000, "[1,]", "{'a': 1}", b"\xff", ""]
)
def test_what_is_not_json_is_refused(text: str | bytes) -> None:
    with pytest.raises(json_text.JsonTextError, match="not valid JSON"):
        json_text.loads(text)


def test_shallow_keeps_the_top_level_fields_only() -> None:
    text = '{"type": "ack", "id": "c-1", "deep": [[{"x": "]}"}]], "n": {"a": []}}'
    assert json.loads(json_text.shallow(text)) == {"type": "ack", "id": "c-1", "deep": 0, "n": 0}


# --- frames -------------------------------------------------------------------------------


def deep_frame(head: str, depth: int) -> str:
    return "{" + head + ', "deep": ' + nested(depth) + "}"


@pytest.mark.parametrize("depth", [p.DEFAULT_FRAME_DEPTH, 990, 5000])
def test_a_too_deep_answer_names_its_type_and_id(depth: int) -> None:
    with pytest.raises(p.ProtocolError) as refused:
        p.decode_runner_frame(deep_frame('"type": "ack", "id": "cmd-1-2"', depth))
    assert refused.value.code == p.INVALID
    assert (refused.value.frame_type, refused.value.frame_id) == ("ack", "cmd-1-2")
    assert f"deeper than {p.DEFAULT_FRAME_DEPTH} levels" in refused.value.message


def test_a_frame_at_the_limit_is_decoded() -> None:
    frame = p.decode_runner_frame(
        '{"type": "nack", "id": "c", "error": {"code": "x", "message": "y"}, "deep": '
        + nested(p.DEFAULT_FRAME_DEPTH - 1)
        + "}"
    )
    assert isinstance(frame, p.Nack)


def test_a_too_deep_event_keeps_its_envelope_so_it_is_acknowledged() -> None:
    item = nested(5000)
    frame = p.decode_runner_frame(
        '{"type": "event", "session_id": "conv_1", "seq": 7, "event": '
        '{"type": "response.output_item.done", "response_id": "resp_1", "item": ' + item + "}}"
    )
    assert isinstance(frame, p.EventFrame)
    assert (frame.session_id, frame.seq) == ("conv_1", 7)
    assert isinstance(frame.event, p.UnparsedEvent)
    assert "deeper than" in frame.event.error


def test_a_too_deep_hello_or_unreadable_frame_is_an_error() -> None:
    with pytest.raises(p.ProtocolError) as hello:
        p.decode_runner_frame(deep_frame('"type": "hello", "protocol": 1', 5000))
    assert (hello.value.code, hello.value.frame_type) == (p.INVALID, "hello")
    with pytest.raises(p.ProtocolError) as bare:
        p.decode_runner_frame(nested(5000))
    assert bare.value.code == p.MALFORMED


def test_the_server_limit_is_the_callers() -> None:
    text = deep_frame('"type": "pong", "ts": 1.0', 20)
    assert isinstance(p.decode_runner_frame(text), p.Pong)
    with pytest.raises(p.ProtocolError, match="deeper than 10 levels"):
        p.decode_runner_frame(text, max_depth=10)


@pytest.mark.parametrize("depth", [p.SERVER_FRAME_DEPTH + 1, 5000])
def test_a_too_deep_command_for_the_runner_can_be_nacked(depth: int) -> None:
    text = deep_frame('"type": "turn.start", "id": "cmd-3-1", "session_id": "s"', depth)
    with pytest.raises(p.ProtocolError) as refused:
        p.decode_server_frame(text)
    assert refused.value.code == p.INVALID
    assert (refused.value.frame_type, refused.value.frame_id) == ("turn.start", "cmd-3-1")


def test_the_runner_takes_whatever_a_server_may_be_configured_to_accept() -> None:
    """The server refuses bodies deeper than its limit (at most the ceiling); a frame
    wraps a body in a few levels, which the margin covers."""
    assert p.SERVER_FRAME_DEPTH == json_text.MAX_DEPTH_CEILING + json_text.FRAME_DEPTH_MARGIN
    body = nested(json_text.MAX_DEPTH_CEILING - 4)
    text = (
        '{"type": "turn.start", "id": "c", "session_id": "s", "response_id": "r", '
        '"input": [{"type": "message", "data": ' + body + "}]}"
    )
    assert isinstance(p.decode_server_frame(text), p.TurnStart)


def test_a_lone_surrogate_in_a_frame_is_malformed_and_says_so() -> None:
    with pytest.raises(p.ProtocolError) as refused:
        p.decode_runner_frame('{"type": "pong", "ts": 1, "x": "\\ud800"}')
    assert refused.value.code == p.MALFORMED
    assert "lone surrogate" in refused.value.message


# --- the server's setting -----------------------------------------------------------------


def settings_value(raw: str) -> subprocess.CompletedProcess[str]:
    code = "import omnigent_site.settings as s; print(s.OMNIGENT_MAX_JSON_DEPTH)"
    env = {**os.environ, "OMNIGENT_MAX_JSON_DEPTH": raw}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_setting_defaults_to_64_and_is_bounded() -> None:
    assert settings_value("").stdout.strip() == "64"
    assert settings_value("128").stdout.strip() == "128"
    for bad in ("0", "257", "lots"):
        refused = settings_value(bad)
        assert refused.returncode != 0
        assert "OMNIGENT_MAX_JSON_DEPTH" in refused.stderr
