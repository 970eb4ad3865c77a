"""The tunnel protocol module (omnigent_runner/protocol.py) and the consumer's error mapping.

The frame lists below are kept here on purpose, apart from the module: the round-trip
tests build every frame they name, the module's own type sets must equal them, and
docs/protocol.md must name each one, so the module, the tests and the doc cannot drift
apart silently. Adding a frame means adding it to all three.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from omnigent_runner import PROTOCOL_VERSION
from omnigent_runner import protocol as p
from omnigent_site.domain_errors import Conflict, Forbidden, NotFound
from runners import tunnel_errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ITEM = {"id": "item_1", "type": "message", "role": "user", "content": [{"type": "input_text"}]}
RULE = p.PolicyRule(
    name="ask_shell",
    tools=["sys_os_shell"],
    action="ask",
    when={"command": "rm"},
    reason="destructive",
    ask_timeout=60.0,
)
VERDICT = p.Verdict(
    elicitation_id="elicit_1",
    response_id="resp_1",
    call_id="call_1",
    action="accept",
    resolved_by="alice",
)

# Every frame on the tunnel, by wire type, with a builder that sets every field.
FRAMES: dict[str, Callable[[], p.Frame]] = {
    # handshake and liveness
    "hello": lambda: p.Hello(
        protocol=PROTOCOL_VERSION,
        runner_version="0.1.0",
        workspace={"root": "/ws", "vcs": "git"},
        capabilities={"isolate_sessions": True},
        open_sessions=["conv_1"],
    ),
    "welcome": lambda: p.Welcome(
        runner_id="runner_token_x",
        heartbeat_s=20.0,
        sessions=[p.SessionCursor(session_id="conv_1", last_acked_seq=4)],
    ),
    "ping": lambda: p.Ping(ts=1718000000.5),
    "pong": lambda: p.Pong(ts=1718000000.5),
    # commands
    "session.open": lambda: p.SessionOpen(
        id="cmd-1-1",
        session_id="conv_1",
        last_acked_seq=3,
        agent=p.AgentRef(id="agent_1", version=2, bundle_b64="UEsDBA=="),
        history=[ITEM],
        policies=[RULE],
        verdicts=[VERDICT],
    ),
    "turn.start": lambda: p.TurnStart(
        id="cmd-1-2",
        session_id="conv_1",
        response_id="resp_1",
        input=[ITEM],
        tools=[{"type": "function", "name": "pick"}],
    ),
    "tool_result": lambda: p.ToolResult(
        id="cmd-1-3", session_id="conv_1", call_id="call_1", output="42"
    ),
    "turn.interrupt": lambda: p.TurnInterrupt(id="cmd-1-4", session_id="conv_1"),
    "session.close": lambda: p.SessionClose(id="cmd-1-5", session_id="conv_1"),
    "rpc": lambda: p.Rpc(id="cmd-1-6", method="workspace.read", params={"path": "a"}),
    "policy.update": lambda: p.PolicyUpdate(id="cmd-1-7", session_id="conv_1", rules=[RULE]),
    "approval.verdict": lambda: p.ApprovalVerdict(
        id="cmd-1-8",
        session_id="conv_1",
        elicitation_id="elicit_1",
        response_id="resp_1",
        call_id="call_1",
        action="decline",
        reason="not now",
        resolved_by="alice",
    ),
    # replies
    "ack": lambda: p.Ack(id="cmd-1-1"),
    "nack": lambda: p.Nack(id=7, error=p.ErrorInfo(code="session_not_open", message="no")),
    "rpc.result": lambda: p.RpcResult(id="cmd-1-6", ok=True, result={"text": "hi"}),
    # events
    "event": lambda: p.EventFrame(
        session_id="conv_1", seq=1, event=p.ResponseCreated(response_id="resp_1")
    ),
    "event.ack": lambda: p.EventAck(session_id="conv_1", seq=1),
    "events": lambda: p.EventBatch(
        events=[
            p.EventFrame(session_id="conv_1", seq=1, event=p.ResponseCreated(response_id="r")),
            p.EventFrame(session_id="conv_2", seq=4, event=p.SessionStatus(status="idle")),
        ]
    ),
    "event.acks": lambda: p.EventAcks(
        acks=[p.EventAck(session_id="conv_1", seq=1), p.EventAck(session_id="conv_2", seq=4)]
    ),
}

# Every event payload (``event.type``).
EVENTS: dict[str, Callable[[], p.Event]] = {
    "session.status": lambda: p.SessionStatus(
        status="failed",
        response_id="resp_1",
        error=p.ErrorInfo(code="model_error", message="broke"),
    ),
    "response.created": lambda: p.ResponseCreated(response_id="resp_1"),
    "response.output_text.delta": lambda: p.OutputTextDelta(
        response_id="resp_1", item_id="item_1", delta="Hel"
    ),
    "response.output_item.done": lambda: p.OutputItemDone(response_id="resp_1", item=ITEM),
    "response.completed": lambda: p.ResponseCompleted(response_id="resp_1"),
    "response.failed": lambda: p.ResponseFailed(
        response_id="resp_1", error=p.ErrorInfo(code="timeout", message="slow")
    ),
    "response.cancelled": lambda: p.ResponseCancelled(response_id="resp_1"),
    "approval.requested": lambda: p.ApprovalRequested(
        response_id="resp_1",
        call_id="call_1",
        tool="sys_os_shell",
        arguments={"command": "rm -rf build"},
        policy_name="ask_shell",
        reason="destructive",
        ask_timeout=3600.0,
    ),
    "policy.denied": lambda: p.PolicyDenied(
        response_id="resp_1",
        call_id="call_1",
        tool="sys_os_shell",
        policy_name="no_shell",
        reason="never",
    ),
    "workspace.changes": lambda: p.WorkspaceChanges(
        environment_id="default",
        mode="agent_edit",
        entries=[{"path": "a.txt", "status": "created", "before": None, "after": "x"}],
    ),
    "session.mcp_status": lambda: p.McpStatus(
        servers={"git": {"status": "ready", "transport": "stdio", "tools": ["git__git_status"]}}
    ),
    "usage.recorded": lambda: p.UsageRecorded(
        response_id="resp_1",
        model="gpt-4o-mini-2024-07-18",
        input_tokens=200,
        output_tokens=80,
        cache_read_input_tokens=1000,
        reasoning_tokens=30,
    ),
}

# Messages between server processes over the channel layer.
CHANNEL_MESSAGES: dict[str, Callable[[], p.ChannelMessage]] = {
    "tunnel.command": lambda: p.TunnelCommand(
        command=FRAMES["turn.start"](),  # type: ignore[arg-type]
        reply_channel="specific.abc!def",
    ),
    "tunnel.reply": lambda: p.TunnelReply(
        ok=False, error=p.ErrorInfo(code="tunnel_closed", message="closing"), status=503
    ),
    "tunnel.replaced": p.TunnelReplaced,
    "tunnel.revoked": p.TunnelRevoked,
}


def decode(frame: p.Frame, text: str) -> p.Frame:
    """Decode with the decoder of the side that receives this frame."""
    if p.frame_type(frame) in p.RUNNER_FRAME_TYPES:
        return p.decode_runner_frame(text)
    return p.decode_server_frame(text)


# --- every frame, both ways ------------------------------------------------------------


@pytest.mark.parametrize("name", FRAMES)
def test_every_frame_round_trips(name: str) -> None:
    frame = FRAMES[name]()
    assert p.frame_type(frame) == name
    text = p.encode(frame)
    assert isinstance(text, str)
    assert decode(frame, text) == frame


@pytest.mark.parametrize("name", EVENTS)
def test_every_event_round_trips_inside_an_event_frame(name: str) -> None:
    event = EVENTS[name]()
    assert p.frame_type(event) == name
    frame = p.EventFrame(session_id="conv_1", seq=9, event=event)  # type: ignore[arg-type]
    assert p.decode_runner_frame(p.encode(frame)) == frame


@pytest.mark.parametrize("name", CHANNEL_MESSAGES)
def test_every_channel_message_round_trips_through_the_layer_format(name: str) -> None:
    message = CHANNEL_MESSAGES[name]()
    wire = p.channel_message(message)
    assert wire["type"] == name  # the consumer's handler is chosen by it
    # channels-redis carries messages as msgpack: they must survive it.
    unpacked = msgpack.unpackb(msgpack.packb(wire), raw=False)
    assert p.decode_channel_message(unpacked) == message


def test_the_lists_here_are_exactly_the_modules_frames() -> None:
    assert p.RUNNER_FRAME_TYPES | p.SERVER_FRAME_TYPES == set(FRAMES)
    assert not p.RUNNER_FRAME_TYPES & p.SERVER_FRAME_TYPES
    assert p.EVENT_TYPES == set(EVENTS)
    assert p.CHANNEL_MESSAGE_TYPES == set(CHANNEL_MESSAGES)
    assert p.COMMAND_TYPES == {
        "session.open",
        "turn.start",
        "tool_result",
        "turn.interrupt",
        "session.close",
        "rpc",
        "policy.update",
        "approval.verdict",
    }


def test_docs_protocol_md_names_every_frame_type() -> None:
    doc = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z_.]+)`", doc))
    missing = sorted((set(FRAMES) | set(EVENTS) | set(CHANNEL_MESSAGES)) - named)
    assert not missing, f"docs/protocol.md does not name: {missing}"


# --- what is written on the wire -----------------------------------------------------------


def test_optional_event_fields_are_left_out_and_defaults_are_filled_in() -> None:
    status = p.SessionStatus(status="idle", response_id="resp_1")
    assert p.to_builtins(status) == {
        "type": "session.status",
        "status": "idle",
        "response_id": "resp_1",
    }
    assert p.to_builtins(p.ResponseCompleted(response_id="r")) == {
        "type": "response.completed",
        "response_id": "r",
    }
    ok = p.RpcResult(id="c", ok=True, result=[1])
    assert p.to_builtins(ok) == {"type": "rpc.result", "id": "c", "ok": True, "result": [1]}
    # An rpc error may name the HTTP status to answer with (workspace.*, files.md §2).
    failed = p.RpcResult(
        id="c", ok=False, error=p.ErrorInfo(code="not_found", message="x"), status=404
    )
    assert p.to_builtins(failed)["status"] == 404
    assert p.decode_runner_frame(p.encode(failed)) == failed
    with pytest.raises(p.ProtocolError):
        p.decode_runner_frame('{"type": "rpc.result", "id": "c", "ok": false, "status": 200}')
    # Commands always carry their lists, empty or not (the runner reads them).
    start = p.TurnStart(id="c", session_id="s", response_id="r")
    assert p.to_builtins(start)["input"] == [] and p.to_builtins(start)["tools"] == []


def test_unknown_extra_keys_are_ignored_for_forward_compatibility() -> None:
    frame = p.decode_runner_frame(
        '{"type": "event", "session_id": "s", "seq": 1, "trace": "x",'
        ' "event": {"type": "response.created", "response_id": "r", "new_field": 1}}'
    )
    assert frame == p.EventFrame(session_id="s", seq=1, event=p.ResponseCreated(response_id="r"))
    command = p.decode_server_frame(
        '{"type": "session.close", "id": "c", "session_id": "s", "x": 1}'
    )
    assert command == p.SessionClose(id="c", session_id="s")


def test_items_stay_free_form_json_objects() -> None:
    item = {"id": "i", "type": "future_item", "nested": {"any": [1, None, "x"]}}
    frame = p.decode_runner_frame(
        p.encode(
            p.EventFrame(session_id="s", seq=1, event=p.OutputItemDone(response_id="r", item=item))
        )
    )
    assert isinstance(frame, p.EventFrame) and isinstance(frame.event, p.OutputItemDone)
    assert frame.event.item == item


def test_tool_result_output_is_text_for_the_model() -> None:
    assert p.ToolResult(session_id="s", call_id="c", output="plain").output_text() == "plain"
    assert p.ToolResult(session_id="s", call_id="c", output={"a": 1}).output_text() == '{"a":1}'
    assert p.ToolResult(session_id="s", call_id="c").output_text() == "null"


def test_with_id_sets_the_command_id_and_leaves_the_original() -> None:
    command = p.TurnInterrupt(session_id="s")
    assert p.with_id(command, "cmd-1-1") == p.TurnInterrupt(id="cmd-1-1", session_id="s")
    assert command.id is None


# --- what is not a frame ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '"hello"', '{"no_type": 1}', '{"type": 5}', ""],
)
def test_malformed_frames_raise_malformed(text: str) -> None:
    for decoder in (p.decode_runner_frame, p.decode_server_frame):
        with pytest.raises(p.ProtocolError) as error:
            decoder(text)
        assert error.value.code == p.MALFORMED
        assert error.value.frame_type is None


def test_an_unknown_type_raises_unknown_type_with_its_id() -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_server_frame('{"type": "workspace.snapshot", "id": "cmd-1-9"}')
    assert (error.value.code, error.value.frame_type, error.value.frame_id) == (
        p.UNKNOWN_TYPE,
        "workspace.snapshot",
        "cmd-1-9",
    )
    # Each side only accepts what travels its way.
    with pytest.raises(p.ProtocolError) as error:
        p.decode_runner_frame(p.encode(FRAMES["welcome"]()))
    assert error.value.code == p.UNKNOWN_TYPE
    with pytest.raises(p.ProtocolError) as error:
        p.decode_server_frame(p.encode(FRAMES["ack"]()))
    assert error.value.code == p.UNKNOWN_TYPE


@pytest.mark.parametrize(
    ("text", "frame_id"),
    [
        ('{"type": "session.open", "id": 9, "agent": {}}', 9),  # no session_id
        ('{"type": "turn.start", "id": "c", "session_id": "s", "response_id": 5}', "c"),
        (
            '{"type": "turn.start", "id": "c", "session_id": "s", "response_id": "r",'
            ' "input": "not a list"}',
            "c",
        ),
        (
            '{"type": "turn.start", "id": "c", "session_id": "s", "response_id": "r",'
            ' "input": [1]}',
            "c",
        ),  # items are JSON objects
        ('{"type": "rpc", "id": "c", "params": {}}', "c"),  # no method
        ('{"type": "welcome", "runner_id": "r", "heartbeat_s": 0}', None),
        ('{"type": "event.ack", "session_id": 5, "seq": "x"}', None),
        ('{"type": "ping", "ts": "now"}', None),
        ('{"type": "turn.interrupt", "id": true, "session_id": "s"}', None),  # bool id
    ],
)
def test_known_types_with_bad_fields_raise_invalid(text: str, frame_id: Any) -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_server_frame(text)
    assert error.value.code == p.INVALID
    assert error.value.frame_id == frame_id
    assert error.value.frame_type == json.loads(text)["type"]


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "ack"}',
        '{"type": "nack", "id": "c", "error": "busy"}',
        '{"type": "rpc.result", "id": "c"}',
        '{"type": "pong"}',
        '{"type": "hello", "protocol": 1, "open_sessions": "conv_1"}',
        '{"type": "event", "session_id": "s", "seq": 0, "event": {}}',
        '{"type": "event", "session_id": "s", "seq": true, "event": {}}',
        '{"type": "event", "seq": 1, "event": {}}',
    ],
)
def test_runner_frames_with_bad_fields_raise_invalid(text: str) -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_runner_frame(text)
    assert error.value.code == p.INVALID


def test_a_nack_without_an_error_is_understood() -> None:
    assert p.decode_runner_frame('{"type": "nack", "id": "c"}') == p.Nack(id="c")


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "hello", "protocol": 2}',
        '{"type": "hello", "protocol": 2, "workspace": "a newer shape"}',
        '{"type": "hello"}',
        '{"type": "hello", "protocol": "1"}',
    ],
)
def test_a_hello_of_another_protocol_raises_unsupported_protocol(text: str) -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_runner_frame(text)
    assert error.value.code == p.UNSUPPORTED_PROTOCOL


@pytest.mark.parametrize(
    "event",
    [
        '{"type": "response.output_text.delta", "response_id": "r"}',  # no item_id
        '{"type": "response.created", "response_id": ""}',  # empty id
        '{"type": "session.status", "status": "sleeping"}',
        '{"type": "workspace.changes", "mode": "svn", "entries": []}',
        '{"type": "from.a.newer.runner"}',
        '"text"',
        "null",
    ],
)
def test_an_unreadable_payload_in_a_valid_envelope_is_an_unparsed_event(event: str) -> None:
    frame = p.decode_runner_frame(
        f'{{"type": "event", "session_id": "s", "seq": 3, "event": {event}}}'
    )
    assert isinstance(frame, p.EventFrame)
    assert (frame.session_id, frame.seq) == ("s", 3)
    assert isinstance(frame.event, p.UnparsedEvent)
    assert frame.event.error


def test_a_frame_that_cannot_be_written_raises_unencodable() -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.encode(p.RpcResult(id="c", ok=True, result=object()))
    assert (error.value.code, error.value.frame_type) == (p.UNENCODABLE, "rpc.result")


def test_channel_messages_that_are_not_ours_raise() -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_channel_message({"type": "tunnel.command", "command": {"type": "nope"}})
    assert error.value.code == p.INVALID
    with pytest.raises(p.ProtocolError) as error:
        p.decode_channel_message({"type": "websocket.receive"})
    assert error.value.code == p.UNKNOWN_TYPE


def test_workspace_changes_from_a_tracker_payload() -> None:
    payload = {"environment_id": "default", "mode": "git", "entries": [{"path": "a"}]}
    assert p.workspace_changes(payload) == p.WorkspaceChanges(mode="git", entries=[{"path": "a"}])
    with pytest.raises(p.ProtocolError):
        p.workspace_changes({"mode": "git"})


# --- the consumer's one error mapping (runners/tunnel_errors.py) --------------------------------


def test_close_codes_for_failures() -> None:
    unsupported = p.ProtocolError(p.UNSUPPORTED_PROTOCOL, "v2")
    assert tunnel_errors.close_code_for(unsupported) == 4002
    for code in (p.MALFORMED, p.UNKNOWN_TYPE, p.INVALID):
        assert tunnel_errors.close_code_for(p.ProtocolError(code, "bad")) == 4001
    assert tunnel_errors.close_code_for(Forbidden("revoked")) == 4004
    assert tunnel_errors.close_code_for(NotFound("gone")) == 1011
    assert tunnel_errors.close_code_for(RuntimeError("db down")) == 1011


def test_reply_errors_for_failures() -> None:
    closed = tunnel_errors.reply_error_for(tunnel_errors.TunnelClosed("closing"))
    assert closed == p.ErrorInfo(code="tunnel_closed", message="closing")
    unreadable = tunnel_errors.reply_error_for(p.ProtocolError(p.INVALID, "bad nack"))
    assert unreadable.code == "invalid_reply" and "bad nack" in unreadable.message
    conflict = tunnel_errors.reply_error_for(Conflict("already resolved", field="action"))
    assert conflict == p.ErrorInfo(code="conflict", message="action: already resolved")
    internal = tunnel_errors.reply_error_for(RuntimeError("secret detail"))
    assert internal.code == "internal_error" and "secret" not in internal.message


def test_a_runners_nack_error_always_has_a_code_and_a_message() -> None:
    assert tunnel_errors.nack_error(None) == p.ErrorInfo(
        code="rejected", message="the runner rejected the command"
    )
    assert tunnel_errors.nack_error(p.ErrorInfo(code="busy")) == p.ErrorInfo(
        code="busy", message="the runner rejected the command"
    )


# --- events frames: a batch is read as its elements would be alone ------------------------


def event_text(seq: int, event: str = '{"type": "response.created", "response_id": "r"}') -> str:
    return f'{{"type": "event", "session_id": "s", "seq": {seq}, "event": {event}}}'


def batch_text(*elements: str) -> str:
    return '{"type": "events", "events": [' + ", ".join(elements) + "]}"


def test_an_unreadable_payload_in_a_batch_is_unparsed_and_the_rest_kept() -> None:
    frame = p.decode_runner_frame(
        batch_text(event_text(1), event_text(2, '{"type": "from.a.newer.runner"}'), event_text(3))
    )
    assert isinstance(frame, p.EventBatch)
    assert [(f.seq, type(f.event)) for f in frame.events] == [
        (1, p.ResponseCreated),
        (2, p.UnparsedEvent),
        (3, p.ResponseCreated),
    ]


def test_elements_of_a_batch_that_are_no_event_frames_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frame = p.decode_runner_frame(
        batch_text(
            event_text(1),
            '{"type": "event", "session_id": "s", "seq": 0, "event": {}}',  # bad envelope
            '{"type": "ack", "id": "cmd-1"}',  # a valid frame, but no event
            event_text(4),
        )
    )
    assert isinstance(frame, p.EventBatch)
    assert [f.seq for f in frame.events] == [1, 4]
    assert "events frame" in caplog.text


def test_a_batch_deeper_than_the_limit_is_read_element_by_element() -> None:
    """Each element is held to the limit it would meet alone, not the batch's depth."""
    limit = p.DEFAULT_FRAME_DEPTH
    # Alone, this element nests exactly ``limit`` levels deep: accepted.
    payload = '{"type": "response.created", "response_id": "r", "x": ' + "[" * (limit - 2)
    fits = event_text(1, payload + "]" * (limit - 2) + "}")
    too_deep = event_text(2, payload + "[" + "]" * (limit - 1) + "}")
    assert p.decode_runner_frame(fits) == p.decode_runner_frame(fits)  # alone: fine
    frame = p.decode_runner_frame(batch_text(fits, too_deep, event_text(3)))
    assert isinstance(frame, p.EventBatch)
    assert [(f.seq, type(f.event)) for f in frame.events] == [
        (1, p.ResponseCreated),
        (2, p.UnparsedEvent),
        (3, p.ResponseCreated),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "events"}',
        '{"type": "events", "events": {"a": 1}}',
        '{"type": "events", "events": [' + "[" * 5000 + "]" * 5000 + "]}",
    ],
)
def test_a_batch_whose_list_cannot_be_read_is_an_invalid_frame(text: str) -> None:
    with pytest.raises(p.ProtocolError) as error:
        p.decode_runner_frame(text)
    assert (error.value.code, error.value.frame_type) == (p.INVALID, "events")


def test_an_older_peer_ignores_the_batch_fields_of_the_handshake() -> None:
    """A runner without batches reads a new welcome; a server reads a new hello."""
    welcome = p.decode_server_frame(
        '{"type": "welcome", "runner_id": "r", "heartbeat_s": 20, "event_batches": true}'
    )
    assert isinstance(welcome, p.Welcome) and welcome.event_batches
    old = p.decode_server_frame('{"type": "welcome", "runner_id": "r", "heartbeat_s": 20}')
    assert isinstance(old, p.Welcome) and not old.event_batches


def test_a_batch_read_element_by_element_keeps_the_callers_nesting_limit() -> None:
    """One bad element sends the batch down the slow path; the others are still held
    to the limit the server passed, not to the default one."""
    limit = p.DEFAULT_FRAME_DEPTH + 40
    levels = p.DEFAULT_FRAME_DEPTH + 10  # deeper than the default, within ``limit``
    deep_payload = (
        '{"type": "response.created", "response_id": "r", "x": ' + "[" * levels + "]" * levels + "}"
    )
    frame = p.decode_runner_frame(
        batch_text(event_text(1, deep_payload), '{"type": "event", "seq": 0}'),
        max_depth=limit,
    )
    assert isinstance(frame, p.EventBatch)
    assert [(f.seq, type(f.event)) for f in frame.events] == [(1, p.ResponseCreated)]
