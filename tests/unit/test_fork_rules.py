"""Which turns and items a fork copies (files.md §3), on unsaved rows: no database."""

from __future__ import annotations

import pytest

from omnigent_site.domain_errors import InvalidInput
from sessions.files import remap_file_ids
from sessions.fork import _items_to_copy, _turns_to_copy, default_title
from sessions.models import Item, Session, Turn


def turns(*statuses: str) -> list[Turn]:
    return [Turn(id=f"resp_{i}", status=status) for i, status in enumerate(statuses)]


def item(item_id: str, response_id: str | None) -> Item:
    return Item(id=item_id, response_id=response_id)


def test_open_turns_are_left_out() -> None:
    kept = _turns_to_copy(turns("completed", "in_progress", "failed", "queued"), None)
    assert [t.id for t in kept] == ["resp_0", "resp_2"]


def test_up_to_stops_at_that_turn() -> None:
    all_turns = turns("completed", "cancelled", "completed")
    assert [t.id for t in _turns_to_copy(all_turns, "resp_1")] == ["resp_0", "resp_1"]
    with pytest.raises(InvalidInput, match="not a response"):
        _turns_to_copy(all_turns, "resp_9")
    with pytest.raises(InvalidInput, match="still running"):
        _turns_to_copy(turns("completed", "in_progress"), "resp_1")


def test_items_stop_after_the_last_item_of_the_turn() -> None:
    items = [
        item("seed", None),
        item("q0", "resp_0"),
        item("a0", "resp_0"),
        item("q1", "resp_1"),
        item("a1", "resp_1"),
        item("q2", "resp_2"),
    ]
    copied = _items_to_copy(items, kept={"resp_0"}, open_turns=set(), up_to="resp_0")
    assert [i.id for i in copied] == ["seed", "q0", "a0"]
    everything = _items_to_copy(items, kept={"resp_0", "resp_1"}, open_turns={"resp_2"}, up_to=None)
    assert [i.id for i in everything] == ["seed", "q0", "a0", "q1", "a1"]


def test_default_title() -> None:
    assert default_title(Session(id="conv_1", title="Plan")) == "Fork of Plan"
    assert default_title(Session(id="conv_1", title=None)) == "Fork of conv_1"
    assert len(default_title(Session(id="conv_1", title="x" * 600))) == 512


def test_file_blocks_follow_the_copies() -> None:
    data = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "hi"},
            {"type": "input_file", "file_id": "file_a"},
            {"type": "input_image", "file_id": "file_gone"},
        ],
    }
    remapped = remap_file_ids(data, {"file_a": "file_b"})
    assert [p.get("file_id") for p in remapped["content"]] == [None, "file_b", "file_gone"]
    assert data["content"][1]["file_id"] == "file_a"  # the source item is not changed
