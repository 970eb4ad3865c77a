"""The comparison behind the forced-drop test (testing/tunnel_drops.py): what it calls
lost, duplicated and out of order, so the e2e test cannot pass on a broken transcript."""

from __future__ import annotations

import random

from testing.tunnel_drops import (
    DropReport,
    ScriptedTurn,
    count_differences,
    expected_items,
    item_key,
    resends,
    script_turn,
)

TURNS = [
    ScriptedTurn(prompt="turn 0", text="Turn 0 says hi.", call_id=None),
    ScriptedTurn(prompt="turn 1", text="Turn 1 says bye.", call_id="call_1"),
]


def test_expected_items_follow_the_script() -> None:
    assert expected_items(TURNS) == [
        ("message", "user", "turn 0"),
        ("message", "assistant", "Turn 0 says hi."),
        ("message", "user", "turn 1"),
        ("function_call", "call_1", "sys_os_write"),
        ("function_call_output", "call_1", ""),
        ("message", "assistant", "Turn 1 says bye."),
    ]


def test_item_key_reads_the_flat_item_shape() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": "Turn 0 "},
            {"type": "output_text", "text": "says hi."},
        ],
    }
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "sys_os_write"}
    assert item_key(message) == ("message", "assistant", "Turn 0 says hi.")
    assert item_key(call) == ("function_call", "call_1", "sys_os_write")


def test_equal_transcripts_report_nothing() -> None:
    report = DropReport()
    count_differences("item", expected_items(TURNS), expected_items(TURNS), report)
    assert (report.lost, report.duplicated, report.problems) == ([], [], [])


def test_a_missing_item_is_lost_and_a_repeated_one_duplicated() -> None:
    expected = expected_items(TURNS)
    report = DropReport()
    count_differences("item", expected, expected[:3] + expected[4:] + [expected[1]], report)
    assert report.lost == ["item ('function_call', 'call_1', 'sys_os_write') x1"]
    assert report.duplicated == ["item ('message', 'assistant', 'Turn 0 says hi.') x1"]


def test_the_same_items_in_another_order_are_a_problem() -> None:
    expected = expected_items(TURNS)
    report = DropReport()
    count_differences("item", expected, list(reversed(expected)), report)
    assert report.problems == ["items out of order"]


def test_script_is_reproducible_from_the_seed() -> None:
    first = [script_turn(i, random.Random(15)) for i in range(3)]
    again = [script_turn(i, random.Random(15)) for i in range(3)]
    assert first == again
    turn, script = script_turn(1, random.Random(15))
    assert script[0]["tool_calls"][0]["call_id"] == turn.call_id == "call_1"
    assert script[-1]["text"] == turn.text and script[-1]["stream"] is True


def test_resends_are_read_from_the_runner_log() -> None:
    log = "tunnel up (heartbeat 0.5 s, resending 0 events)\n... resending 7 events)\n"
    assert resends(log) == [0, 7]
