"""Runner events reach the server's state through one handler per event type
(``runner_events.HANDLERS``): the table covers the protocol, and what it cannot take is
malformed, as before the table."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from omnigent_runner import protocol
from runners import runner_events


def test_every_runner_event_type_of_the_protocol_has_a_handler() -> None:
    """A new event in ``protocol.AnyEvent`` without a handler fails here, not in production
    (where it would be logged and skipped as malformed)."""
    assert set(runner_events.HANDLERS) == set(get_args(protocol.AnyEvent))
    assert {protocol.tag_of(kind) for kind in runner_events.HANDLERS} == protocol.EVENT_TYPES


class _Unknown(protocol.Event, tag="made.up", kw_only=True, frozen=True):
    response_id: str


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (_Unknown(response_id="resp_1"), "made.up is not handled by this server"),
        (
            protocol.UnparsedEvent(raw={"type": "x"}, error="no such event type"),
            "no such event type",
        ),
    ],
)
def test_an_event_without_a_handler_is_malformed(event: Any, message: str) -> None:
    run: Any = None  # never reached: nothing is applied
    with pytest.raises(runner_events.MalformedEvent, match=message):
        runner_events._apply(run, event)
