"""How the runner's sender packs frames into messages (``omnigent_runner.event_batches``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from omnigent_runner import event_batches
from omnigent_runner.event_batches import MAX_BATCH_EVENTS, pack_messages
from omnigent_runner.protocol import (
    Ack,
    EventBatch,
    EventFrame,
    Frame,
    OutputTextDelta,
    Pong,
    ResponseCreated,
    RpcResult,
    decode_runner_frame,
    encode_bytes,
)


def event(seq: int, session_id: str = "s1", **fields: Any) -> EventFrame:
    return EventFrame(
        session_id=session_id, seq=seq, event=ResponseCreated(response_id=f"r{seq}", **fields)
    )


def delta(seq: int, text: str) -> EventFrame:
    return EventFrame(
        session_id="s1",
        seq=seq,
        event=OutputTextDelta(response_id="r", item_id="msg", delta=text),
    )


def shapes(messages: Iterable[bytes]) -> list[Any]:
    """Each message as its type, or for a batch the seqs it carries."""
    out: list[Any] = []
    for message in messages:
        frame = json.loads(message)
        if frame["type"] == "events":
            out.append([element["seq"] for element in frame["events"]])
        else:
            out.append(frame["type"] if frame["type"] != "event" else frame["seq"])
    return out


def test_runs_of_events_become_batches_and_other_frames_split_them() -> None:
    frames: list[Frame] = [event(1), event(2), Ack(id="c1"), event(3), Pong(ts=1), event(4)]
    assert shapes(pack_messages(frames, batch_events=True)) == [[1, 2], "ack", 3, "pong", 4]


def test_without_the_servers_offer_every_event_is_its_own_frame() -> None:
    frames: list[Frame] = [event(1), event(2), event(3)]
    assert shapes(pack_messages(frames, batch_events=False)) == [1, 2, 3]


def test_a_batch_decodes_to_the_frames_that_went_in() -> None:
    frames = [event(1), delta(2, "héllo ✓"), event(3, session_id="s2")]
    (message,) = pack_messages(frames, batch_events=True)
    assert decode_runner_frame(message) == EventBatch(events=frames)


def test_a_run_is_cut_at_the_event_count() -> None:
    frames: list[Frame] = [event(n) for n in range(1, 2 * MAX_BATCH_EVENTS + 2)]
    sizes = [
        len(s) if isinstance(s, list) else 1
        for s in shapes(pack_messages(frames, batch_events=True))
    ]
    assert sizes == [MAX_BATCH_EVENTS, MAX_BATCH_EVENTS, 1]


def test_a_run_is_cut_at_the_byte_budget_and_a_large_event_goes_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = len(encode_bytes(delta(1, "x" * 100)))
    monkeypatch.setattr(event_batches, "MAX_BATCH_BYTES", 2 * (one + 1))  # two fit
    frames: list[Frame] = [delta(n, "x" * 100) for n in range(1, 6)]
    frames.insert(2, delta(99, "y" * 3 * one))  # larger than the budget on its own
    assert shapes(pack_messages(frames, batch_events=True)) == [[1, 2], 99, [3, 4], 5]


def test_an_event_nesting_too_deep_for_a_batch_goes_alone() -> None:
    depth = event_batches.BATCHABLE_DEPTH
    deep: Any = []
    for _ in range(depth):
        deep = [deep]
    # Built from a dict, as the runner's tests emit events: the payload is free to nest.
    deep_event = EventFrame(session_id="s1", seq=2, event={"type": "x", "v": deep})  # type: ignore[arg-type]
    frames: list[Frame] = [event(1), deep_event, event(3)]
    assert shapes(pack_messages(frames, batch_events=True)) == [1, 2, 3]


def test_messages_come_out_as_they_are_whole() -> None:
    """A resend of thousands of events holds one batch encoded at a time, not all."""
    reached: list[int] = []

    def frames() -> Iterable[Frame]:
        for n in range(1, 2 * MAX_BATCH_EVENTS + 1):
            reached.append(n)
            yield event(n)

    messages = pack_messages(frames(), batch_events=True)
    first = json.loads(next(messages))
    assert len(first["events"]) == MAX_BATCH_EVENTS
    assert len(reached) == MAX_BATCH_EVENTS + 1  # the frame that ended the first run
    assert len(json.loads(next(messages))["events"]) == MAX_BATCH_EVENTS


def test_a_frame_that_cannot_be_encoded_is_dropped_and_the_rest_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frames: list[Frame] = [event(1), RpcResult(id="c", ok=True, result=object()), event(2)]
    # Nothing was sent between the two events, so they still share a message.
    assert shapes(pack_messages(frames, batch_events=True)) == [[1, 2]]
    assert "cannot be encoded" in caplog.text
