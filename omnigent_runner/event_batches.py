"""The runner's frames as WebSocket messages: consecutive events share one message.

A text turn is seven events, and twenty turns at once are a hundred and forty: sent one
message each, every event pays the server a WebSocket frame, a trip through the
consumer's dispatch and a parse of its own, and the runner a ``send``. The tunnel's
sender therefore takes everything that is queued when it wakes and packs each run of
consecutive ``event`` frames into one ``events`` message (docs/protocol.md, Events),
without waiting for more: a lone event leaves as soon as it would have alone, so no
latency is added, and batches form exactly when events pile up faster than they leave.

Order is kept: a non-event frame (an ``ack``, an ``rpc.result``, a ``pong``) ends the run
before it. Each element of a batch is the same ``event`` frame that would otherwise have
been sent alone, so the server stores, skips and acknowledges exactly as before.

A run is cut at :data:`MAX_BATCH_EVENTS` events or :data:`MAX_BATCH_BYTES` bytes. An
event larger than that, or nesting deeper than the deepest limit a server may be
configured with, travels alone, so a batch is never what makes the server refuse a
message or read an element through its slow path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from omnigent_runner.json_text import FRAME_DEPTH_MARGIN, MAX_DEPTH_CEILING, is_too_deep
from omnigent_runner.protocol import EventFrame, Frame, ProtocolError, encode_bytes

logger = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 256
MAX_BATCH_BYTES = 1024 * 1024
# Elements deeper than this travel alone (two levels less than a server's deepest limit:
# the batch's own object and list).
BATCHABLE_DEPTH = MAX_DEPTH_CEILING + FRAME_DEPTH_MARGIN - 2

_HEAD = b'{"type":"events","events":['
_TAIL = b"]}"


def pack_messages(frames: Iterable[Frame], *, batch_events: bool) -> Iterator[bytes]:
    """The UTF-8 JSON texts to send for ``frames``, in order, each as soon as it is whole.

    With ``batch_events`` (the server's ``welcome`` offered it), each run of consecutive
    events becomes one ``events`` message; a run of one stays a plain ``event``. A frame
    that cannot be encoded is logged and left out, as the sender always did. Frames are
    encoded as they are reached, so a long resend holds one batch encoded at a time.
    """
    run: list[bytes] = []
    run_bytes = 0
    for frame in frames:
        try:
            data = encode_bytes(frame)
        except ProtocolError as exc:
            logger.error("dropping a frame that cannot be encoded: %s", exc)
            continue
        if not (batch_events and type(frame) is EventFrame and _batchable(data)):
            if run:
                yield _message(run)
                run, run_bytes = [], 0
            yield data
            continue
        if len(run) == MAX_BATCH_EVENTS or run_bytes + len(data) > MAX_BATCH_BYTES:
            yield _message(run)
            run, run_bytes = [], 0
        run.append(data)
        run_bytes += len(data) + 1
    if run:
        yield _message(run)


def _message(run: list[bytes]) -> bytes:
    """One event alone as its own frame, several as an ``events`` frame."""
    return run[0] if len(run) == 1 else _HEAD + b",".join(run) + _TAIL


def _batchable(data: bytes) -> bool:
    return len(data) < MAX_BATCH_BYTES and not is_too_deep(data, BATCHABLE_DEPTH)
