"""The scheduler's rule (usage.md, Fair share of runners), without a database: which
waiting turns take the free slots, and the place each other one is shown."""

from __future__ import annotations

from collections import Counter

from runners.scheduler import Slots, plan
from sessions.turn_queue import Waiting, positions

ALICE, BOB, CAROL = 1, 2, 3


def waiting(
    seq: int, user: int | None, *, session: str | None = None, runner: str = "r1"
) -> Waiting:
    return Waiting(
        seq=seq,
        response_id=f"resp_{seq}",
        session_id=session or f"conv_{seq}",
        runner_id=runner,
        user_id=user,
    )


def started(turns: list[Waiting]) -> list[int]:
    return [turn.seq for turn in turns]


def test_one_user_with_fifty_turns_does_not_starve_another_with_one() -> None:
    """The fairness scenario: 4 slots held by Alice, her 46 more waiting before Bob's
    one; the next freed slot goes to Bob."""
    queue = [waiting(seq, ALICE) for seq in range(5, 51)] + [waiting(51, BOB)]
    slots = Slots(capacity={"r1": 4}, running_on=Counter({"r1": 4}))
    slots.running_for[ALICE] = 4
    assert plan(queue, slots) == []
    # One of Alice's turns ends: one slot free.
    slots.running_on["r1"] = 3
    slots.running_for[ALICE] = 3
    assert started(plan(queue, slots)) == [51]


def test_free_slots_alternate_between_users_oldest_first() -> None:
    queue = [waiting(1, ALICE), waiting(2, ALICE), waiting(3, ALICE), waiting(4, BOB)]
    queue += [waiting(5, CAROL), waiting(6, BOB)]
    # Alice's oldest, then Bob and Carol (none running), then Alice and Bob again.
    assert started(plan(queue, Slots(capacity={"r1": 5}))) == [1, 4, 5, 2, 6]


def test_with_one_slot_users_take_turns() -> None:
    """Holding as many slots (none), the user who got one the longest ago goes first:
    Alice just had the slot, so Bob's newer turn starts before her older ones."""
    queue = [waiting(seq, ALICE) for seq in range(2, 6)] + [waiting(6, BOB)]
    slots = Slots(capacity={"r1": 1}, last_started={ALICE: 1000.0})
    assert started(plan(queue, slots)) == [6]
    # Bob's turn ends: Alice's oldest is next, then Bob (if he asks again) before her rest.
    slots.running_on["r1"], slots.running_for[BOB] = 0, 0
    queue = [waiting(seq, ALICE) for seq in range(2, 6)] + [waiting(7, BOB)]
    assert started(plan(queue, slots)) == [2]
    slots.running_on["r1"], slots.running_for[ALICE] = 0, 0
    assert started(plan(queue[1:], slots)) == [7]


def test_places_with_one_slot_alternate_users() -> None:
    queue = [waiting(seq, ALICE) for seq in (1, 2, 3)] + [waiting(4, BOB), waiting(5, BOB)]
    places = positions(queue, running_for=Counter(), last_started={ALICE: 50.0, BOB: 10.0})
    order = sorted(
        (entry["position"], entry["response_id"])
        for entries in places.values()
        for entry in entries
    )
    assert [rid for _position, rid in order] == ["resp_4", "resp_1", "resp_5", "resp_2", "resp_3"]


def test_a_runner_never_gets_more_than_it_declared() -> None:
    queue = [waiting(seq, ALICE if seq % 2 else BOB) for seq in range(1, 20)]
    slots = Slots(capacity={"r1": 3}, running_on=Counter({"r1": 1}))
    assert len(plan(queue, slots)) == 2
    assert slots.running_on["r1"] == 3
    assert plan(queue[2:], slots) == []


def test_the_per_user_cap_holds_across_runners() -> None:
    queue = [waiting(1, ALICE, runner="r1"), waiting(2, ALICE, runner="r2")]
    queue += [waiting(3, ALICE, runner="r2"), waiting(4, BOB, runner="r2")]
    slots = Slots(capacity={"r1": 8, "r2": 8}, user_cap=2)
    assert started(plan(queue, slots)) == [1, 4, 2]
    assert slots.running_for[ALICE] == 2


def test_a_session_holding_a_slot_takes_its_next_turn_even_when_the_runner_is_full() -> None:
    """The runner runs a session's turns one after the other: a follow-up message joins
    the slot its session holds, and needs none of its own."""
    slots = Slots(capacity={"r1": 1}, running_on=Counter({"r1": 1}), busy_sessions={"conv_busy"})
    slots.running_for[ALICE] = 1
    queue = [waiting(1, BOB), waiting(2, ALICE, session="conv_busy")]
    assert started(plan(queue, slots)) == [2]
    assert slots.running_on["r1"] == 1


def test_a_sessions_turns_start_in_order() -> None:
    queue = [waiting(1, ALICE, session="conv_a"), waiting(2, ALICE, session="conv_a")]
    queue += [waiting(3, BOB)]
    slots = Slots(capacity={"r1": 1})
    # conv_a's first takes the slot; its second then joins it (same session); Bob waits.
    assert started(plan(queue, slots)) == [1, 2]
    assert plan([waiting(3, BOB)], slots) == []


def test_nothing_starts_on_an_offline_or_unbound_runner() -> None:
    queue = [waiting(1, ALICE, runner="gone"), Waiting(2, "resp_2", "conv_2", None, ALICE)]
    assert plan(queue, Slots(capacity={"r1": 8})) == []


def test_places_follow_the_same_rule_per_runner() -> None:
    """Alice holds 4 slots with 3 more waiting, Bob waits with 1: Bob is next."""
    queue = [waiting(seq, ALICE) for seq in (5, 6, 7)] + [waiting(8, BOB)]
    queue.append(waiting(9, CAROL, runner="r2"))
    places = positions(queue, running_for=Counter({ALICE: 4}), last_started={})
    assert places == {
        "conv_8": [{"response_id": "resp_8", "position": 1}],
        "conv_5": [{"response_id": "resp_5", "position": 2}],
        "conv_6": [{"response_id": "resp_6", "position": 3}],
        "conv_7": [{"response_id": "resp_7", "position": 4}],
        "conv_9": [{"response_id": "resp_9", "position": 1}],  # another runner's queue
    }


def test_places_of_one_session_are_listed_together_in_order() -> None:
    queue = [
        waiting(1, ALICE, session="conv_a"),
        waiting(2, BOB),
        waiting(3, ALICE, session="conv_a"),
    ]
    places = positions(queue, running_for=Counter(), last_started={})
    assert places["conv_a"] == [
        {"response_id": "resp_1", "position": 1},
        {"response_id": "resp_3", "position": 3},
    ]
    assert places["conv_2"] == [{"response_id": "resp_2", "position": 2}]
