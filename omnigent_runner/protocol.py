"""The runner tunnel protocol (tunnel.md): every frame as typed data, and the one place
that builds, encodes and parses frames.

The server's consumer, relay and services and the runner program all speak through this
module, so a frame has one definition and the two ends cannot drift apart. It is
Django-free (an import-linter contract checks it) because the runner imports it on
machines that have no server installed.

Frames are `msgspec <https://jcristharif.com/msgspec/>`_ structs, chosen by measurement
(``bench/protocol.py``): decoding and validating a frame into typed data costs less than
``json.loads`` into plain dicts did, so the typed tunnel is no slower than the hand-made
one. Each frame class carries its wire ``type`` as the msgspec tag, so ``encode`` writes
it and the decoders dispatch on it.

Validation rules (docs/protocol.md, "Where the protocol lives"):

* The envelope fields are typed; the items inside ``history``, ``input``, ``tools`` and
  ``item`` stay free-form JSON objects, because their shape is the HTTP API's.
* Unknown extra keys are ignored, so a newer runner or server can add fields without
  breaking an older peer.
* Anything that is not a valid frame raises :class:`ProtocolError` with a ``code`` that
  says what was wrong and, when it could be read, the frame's ``type`` and ``id``, so the
  receiver can close, nack or ignore it as documented.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar, get_args

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

from omnigent_runner import PROTOCOL_VERSION
from omnigent_runner.json_text import (
    DEFAULT_MAX_DEPTH,
    FRAME_DEPTH_MARGIN,
    MAX_DEPTH_CEILING,
    explain_decode_error,
    is_too_deep,
    not_utf8_message,
    shallow,
    too_deep_message,
)

logger = logging.getLogger(__name__)

JsonObject: TypeAlias = dict[str, Any]
# Command ids are chosen by the server (``cmd-<generation>-<n>``); the runner echoes any
# string or integer id back, as it always has.
CommandId: TypeAlias = str | int
Seq = Annotated[int, Meta(ge=1)]
Cursor = Annotated[int, Meta(ge=0)]
NonEmptyStr = Annotated[str, Meta(min_length=1)]
# Frames nesting deeper than this are refused (``omnigent_runner.json_text``). The server
# decodes runner frames with its own limit, ``OMNIGENT_MAX_JSON_DEPTH`` plus the margin.
# The runner accepts server frames up to the deepest limit a server may be configured
# with: the server already refused deeper input, and a runner must not refuse what a
# correctly configured server relays.
DEFAULT_FRAME_DEPTH = DEFAULT_MAX_DEPTH + FRAME_DEPTH_MARGIN
SERVER_FRAME_DEPTH = MAX_DEPTH_CEILING + FRAME_DEPTH_MARGIN
HttpStatus = Annotated[int, Meta(ge=400, le=599)]


# --- errors --------------------------------------------------------------------------

MALFORMED = "malformed_frame"  # not JSON, not an object, or no string ``type``
UNKNOWN_TYPE = "unknown_frame_type"  # a ``type`` this side does not receive
INVALID = "invalid_frame"  # a known ``type`` with missing or wrongly typed fields
UNSUPPORTED_PROTOCOL = "unsupported_protocol"  # a ``hello`` for another protocol version
UNENCODABLE = "unencodable_frame"  # a frame whose data cannot be written as JSON


class ProtocolError(ValueError):
    """A frame that is not a valid frame of this protocol.

    ``frame_type`` and ``frame_id`` are set when they could be read from the broken frame:
    the runner needs the id to ``nack`` a malformed command, the consumer to fail the
    command a malformed answer was meant for.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        frame_type: str | None = None,
        frame_id: CommandId | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_type = frame_type
        self.frame_id = frame_id

    def __str__(self) -> str:
        where = f"{self.frame_type} frame: " if self.frame_type else ""
        return f"{self.code}: {where}{self.message}"


# --- building blocks -------------------------------------------------------------------


class ErrorInfo(Struct, frozen=True, kw_only=True):
    """``{"code", "message"}`` of a nack, an rpc error, a relay reply or a failed turn.

    Both default to ``""`` so a peer that leaves one out is still understood; readers
    substitute their documented default code.
    """

    code: str = ""
    message: str = ""
    # A runner's ``budget_exceeded`` failure names the budget it stopped at (usage.md,
    # Budgets): ``session``|``user``, and the limit and the spend in USD. Left out of
    # the frame otherwise; an older server ignores them, an older runner sends none.
    scope: str | UnsetType = UNSET
    budget_usd: float | UnsetType = UNSET
    spent_usd: float | UnsetType = UNSET


class AgentRef(Struct, frozen=True, kw_only=True):
    """The agent of ``session.open``. Missing fields decode to empty values: the session
    still opens and its turns fail with ``agent_load_failed`` (docs/protocol.md)."""

    id: str = ""
    version: int = 0
    bundle_b64: str = ""


class SessionCursor(Struct, frozen=True, kw_only=True):
    """One bound session in ``welcome``: the last event seq the server stored."""

    session_id: str
    last_acked_seq: Cursor


class PolicyRule(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A policy rule (approvals.md). Defined ahead of the approvals feature."""

    name: str
    tools: list[str]
    action: Literal["allow", "deny", "ask"]
    when: dict[str, str] | None = None
    reason: str | None = None
    ask_timeout: float | None = None


class Verdict(Struct, frozen=True, kw_only=True):
    """A stored approval verdict the runner has not acknowledged (``session.open``)."""

    elicitation_id: str
    response_id: str
    call_id: str
    action: Literal["accept", "decline", "cancel"]
    reason: str | None = None
    # Who answered (the user id the runner names in a decline's output); unset for an
    # expiry or an older server.
    resolved_by: str | None = None
    # An accepted MCP server question's answer (mcp.md), checked against its schema;
    # left out of the frame otherwise.
    content: JsonObject | UnsetType = UNSET


class BudgetLine(Struct, frozen=True, kw_only=True):
    """One budget the runner checks before every LLM call (usage.md): its limit and what
    has been spent against it, in nano-dollars (the exact integers the server stores)."""

    scope: Literal["session", "user"]
    limit_nano: Annotated[int, Meta(ge=0)]
    spent_nano: Annotated[int, Meta(ge=0)]
    # The server's own choice of what happens at the limit (a schedule's ``max_cost_usd``
    # is ``deny``); ``None``: the bundle's ``guardrails.on_budget`` decides.
    on_budget: Literal["ask", "deny"] | None = None


class Budgets(Struct, frozen=True, kw_only=True):
    """The budgets of one session as the server knows them; ``None``: no such budget (a
    bundle's own ``guardrails.budget_usd`` may still apply to the session)."""

    session: BudgetLine | None = None
    user: BudgetLine | None = None


# --- frames ----------------------------------------------------------------------------


class Frame(Struct, tag_field="type", frozen=True, kw_only=True):
    """A tunnel frame; its class's tag is the wire ``type``."""


# handshake and liveness


class Hello(Frame, tag="hello", kw_only=True, frozen=True):
    """Runner → server, the first frame. ``workspace`` and ``capabilities`` are stored or
    ignored as given; ``open_sessions`` and ``max_turns`` are this project's additions
    to the spec."""

    protocol: int
    runner_version: str = ""
    workspace: JsonObject = {}
    capabilities: JsonObject = {}
    open_sessions: list[str] = []
    # How many turns the runner runs at once (``OMNIGENT_RUNNER_MAX_TURNS``); the server
    # starts no more on it. Absent (an older runner): the server's default.
    max_turns: Annotated[int, Meta(ge=1, le=1000)] | None = None


class Welcome(Frame, tag="welcome", kw_only=True, frozen=True):
    runner_id: str
    heartbeat_s: Annotated[float, Meta(gt=0)]
    sessions: list[SessionCursor] = []
    # The server takes ``events`` frames (an addition to the spec); an older server
    # leaves it out, and its runners send one ``event`` frame per event.
    event_batches: bool = False


class Ping(Frame, tag="ping", kw_only=True, frozen=True):
    ts: float


class Pong(Frame, tag="pong", kw_only=True, frozen=True):
    ts: float


# commands (server → runner)


class Command(Frame, kw_only=True, frozen=True):
    """A command: the consumer sets ``id`` (unique per tunnel) when it forwards it;
    the runner ignores a command without one."""

    id: CommandId | None = None


class SessionOpen(Command, tag="session.open", kw_only=True, frozen=True):
    session_id: str
    # The server's ``Session.last_runner_seq`` (an addition to the spec).
    last_acked_seq: Cursor | None = None
    agent: AgentRef
    history: list[JsonObject] = []
    policies: list[PolicyRule] = []
    verdicts: list[Verdict] = []
    # The session's budgets when it opens (usage.md; absent from older servers).
    budgets: Budgets | None = None


class TurnStart(Command, tag="turn.start", kw_only=True, frozen=True):
    session_id: str
    response_id: str
    input: list[JsonObject] = []
    tools: list[JsonObject] = []
    # The id of the server request that started the turn (``X-Request-ID``), for the
    # runner's log lines of the turn (an addition to the spec; absent from older servers).
    request_id: str | None = None
    # The budgets as the turn starts (usage.md; absent from older servers).
    budgets: Budgets | None = None


class ToolResult(Command, tag="tool_result", kw_only=True, frozen=True):
    session_id: str
    call_id: str
    output: Any = None

    def output_text(self) -> str:
        """The output as the model sees it: a string, or the JSON of anything else."""
        if isinstance(self.output, str):
            return self.output
        return msgspec.json.encode(self.output).decode("utf-8")


class TurnInterrupt(Command, tag="turn.interrupt", kw_only=True, frozen=True):
    session_id: str


class SessionClose(Command, tag="session.close", kw_only=True, frozen=True):
    session_id: str


class Rpc(Command, tag="rpc", kw_only=True, frozen=True):
    method: str
    params: JsonObject = {}


class PolicyUpdate(Command, tag="policy.update", kw_only=True, frozen=True):
    session_id: str
    # ``None``: the rules are unchanged (an update that carries only budgets).
    rules: list[PolicyRule] | None = None
    # The budgets after a recorded LLM call or a budget change (usage.md); ``None``:
    # unchanged.
    budgets: Budgets | None = None


class ApprovalVerdict(
    Command, tag="approval.verdict", kw_only=True, frozen=True, omit_defaults=True
):
    session_id: str
    elicitation_id: str
    response_id: str
    call_id: str
    action: Literal["accept", "decline", "cancel"]
    reason: str | None = None
    resolved_by: str | None = None
    # An accepted MCP server question's answer (mcp.md).
    content: JsonObject | None = None

    def verdict(self) -> Verdict:
        """The verdict this frame carries, in the form ``session.open`` sends it."""
        return Verdict(
            elicitation_id=self.elicitation_id,
            response_id=self.response_id,
            call_id=self.call_id,
            action=self.action,
            reason=self.reason,
            resolved_by=self.resolved_by,
            content=UNSET if self.content is None else self.content,
        )


# replies (runner → server)


class Ack(Frame, tag="ack", kw_only=True, frozen=True):
    id: CommandId


class Nack(Frame, tag="nack", kw_only=True, frozen=True):
    id: CommandId
    error: ErrorInfo = field(default_factory=ErrorInfo)


class RpcResult(Frame, tag="rpc.result", kw_only=True, frozen=True, omit_defaults=True):
    id: CommandId
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    # With an error: the HTTP status the server answers with (workspace.*, files.md §2).
    status: HttpStatus | None = None


# event payloads (``event.type``)


class Event(Struct, tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    """An event payload; optional fields that are unset are left out of the JSON."""


StatusName: TypeAlias = Literal["running", "waiting", "idle", "failed"]


class SessionStatus(Event, tag="session.status", kw_only=True, frozen=True):
    status: StatusName
    response_id: NonEmptyStr | None = None
    error: ErrorInfo | None = None


class ResponseCreated(Event, tag="response.created", kw_only=True, frozen=True):
    response_id: NonEmptyStr


class OutputTextDelta(Event, tag="response.output_text.delta", kw_only=True, frozen=True):
    response_id: NonEmptyStr
    item_id: NonEmptyStr
    delta: str


class OutputItemDone(Event, tag="response.output_item.done", kw_only=True, frozen=True):
    response_id: NonEmptyStr
    item: JsonObject


class ResponseCompleted(Event, tag="response.completed", kw_only=True, frozen=True):
    response_id: NonEmptyStr
    error: ErrorInfo | None = None


class ResponseFailed(Event, tag="response.failed", kw_only=True, frozen=True):
    response_id: NonEmptyStr
    error: ErrorInfo | None = None


class ResponseCancelled(Event, tag="response.cancelled", kw_only=True, frozen=True):
    response_id: NonEmptyStr
    error: ErrorInfo | None = None


class ApprovalRequested(Event, tag="approval.requested", kw_only=True, frozen=True):
    """Defined ahead of the approvals feature (approvals.md)."""

    response_id: NonEmptyStr
    call_id: str
    tool: str
    arguments: JsonObject
    policy_name: str
    reason: str
    ask_timeout: float
    # An MCP server's own question during the call (mcp.md): ``{"message",
    # "requestedSchema"}``; ``policy_name`` is then empty (no rule asked).
    elicitation: JsonObject | None = None
    # ``budget``: not a tool call but a spent budget before a model call (usage.md);
    # ``tool`` is then empty, ``call_id`` ``budget_<n>``, ``policy_name`` ``budget`` and
    # ``arguments`` the question's params ``{kind, scope, budget_usd, spent_usd,
    # increment_usd}``.
    phase: Literal["tool_call", "budget"] = "tool_call"


class PolicyDenied(Event, tag="policy.denied", kw_only=True, frozen=True):
    """Defined ahead of the approvals feature (approvals.md)."""

    response_id: NonEmptyStr
    call_id: str
    tool: str
    policy_name: str
    reason: str


class WorkspaceChanges(
    Event, tag="workspace.changes", kw_only=True, frozen=True, omit_defaults=False
):
    environment_id: str = "default"
    mode: Literal["agent_edit", "git"]
    entries: list[JsonObject]


class McpStatus(Event, tag="session.mcp_status", kw_only=True, frozen=True):
    """Every MCP server of the session and its state (mcp.md): ``{name: {status,
    transport, tools, error?}}``, sent whenever one changes."""

    servers: dict[str, JsonObject]


TokenCount = Annotated[int, Meta(ge=0)]


class UsageRecorded(Event, tag="usage.recorded", kw_only=True, frozen=True, omit_defaults=False):
    """What one LLM call of a turn used (usage.md): one per call, the provider's counts
    (``input_tokens`` without the cached part); ``reported`` false when it gave none,
    and then the counts are zero and mean nothing."""

    response_id: NonEmptyStr
    model: str = ""
    input_tokens: TokenCount = 0
    output_tokens: TokenCount = 0
    cache_read_input_tokens: TokenCount = 0
    cache_creation_input_tokens: TokenCount = 0
    reasoning_tokens: TokenCount = 0
    reported: bool = True


AnyEvent: TypeAlias = (
    SessionStatus
    | ResponseCreated
    | OutputTextDelta
    | OutputItemDone
    | ResponseCompleted
    | ResponseFailed
    | ResponseCancelled
    | ApprovalRequested
    | PolicyDenied
    | WorkspaceChanges
    | McpStatus
    | UsageRecorded
)
TurnEnd: TypeAlias = ResponseCompleted | ResponseFailed | ResponseCancelled


class UnparsedEvent(Struct, frozen=True, kw_only=True):
    """Not a wire type: stands in for an event payload that could not be parsed.

    :func:`decode_runner_frame` returns it inside an otherwise valid ``event`` frame, so
    the server still records the seq and acknowledges it (the event is skipped, never
    resent forever), as tunnel.md asks for events it cannot apply.
    """

    raw: Any
    error: str


class EventFrame(Frame, tag="event", kw_only=True, frozen=True):
    session_id: str
    seq: Seq
    # On the wire always one of the event types; only the decoder's fallback puts an
    # UnparsedEvent here, so msgspec is shown the tagged union alone.
    if TYPE_CHECKING:
        event: AnyEvent | UnparsedEvent
    else:
        event: AnyEvent


class EventAck(Frame, tag="event.ack", kw_only=True, frozen=True):
    session_id: str
    seq: Cursor


# The ``hello`` capability (runner: reads ``event.acks``) and the ``welcome`` field
# (server: takes ``events``) of batched event delivery.
EVENT_BATCHES = "event_batches"


class EventBatch(Frame, tag="events", kw_only=True, frozen=True):
    """Runner → server: consecutive ``event`` frames in one message, in their order.

    An addition to the spec, sent only to a server whose ``welcome`` has
    ``event_batches``. Each element is a whole ``event`` frame and is read as one: a
    batch changes how many messages cross the socket, never what is stored or acked.
    """

    events: list[EventFrame]


class EventAcks(Frame, tag="event.acks", kw_only=True, frozen=True):
    """Server → runner: several sessions' cumulative ``event.ack`` in one message.

    An addition to the spec, sent only to a runner whose ``hello`` capabilities have
    ``event_batches``.
    """

    acks: list[EventAck]


# --- server-internal channel-layer messages ------------------------------------------------


class ChannelMessage(Struct, tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    """A message between server processes over the channel layer (never on the tunnel).

    The channel layer carries plain dicts: convert with :func:`channel_message` and
    :func:`decode_channel_message`. The tag doubles as the consumer's handler name.
    """


class TunnelCommand(ChannelMessage, tag="tunnel.command", kw_only=True, frozen=True):
    """Forward ``command`` to the runner; answer on ``reply_channel`` (if any)."""

    command: AnyCommand
    reply_channel: str | None = None


class TunnelReply(ChannelMessage, tag="tunnel.reply", kw_only=True, frozen=True):
    """The runner's answer (or the consumer's failure) for a relayed command."""

    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    status: HttpStatus | None = None  # an rpc error's HTTP status, as the runner gave it


class TunnelReplaced(ChannelMessage, tag="tunnel.replaced", kw_only=True, frozen=True):
    """A newer connection of the same runner took over: close with 4000."""


class TunnelRevoked(ChannelMessage, tag="tunnel.revoked", kw_only=True, frozen=True):
    """The runner was revoked: close with 4004."""


# --- unions, decoders, encoder ---------------------------------------------------------------

AnyCommand: TypeAlias = (
    SessionOpen
    | TurnStart
    | ToolResult
    | TurnInterrupt
    | SessionClose
    | Rpc
    | PolicyUpdate
    | ApprovalVerdict
)
C = TypeVar("C", bound=Command)
RunnerFrame: TypeAlias = Hello | Pong | Ack | Nack | RpcResult | EventFrame | EventBatch
ServerFrame: TypeAlias = Welcome | Ping | EventAck | EventAcks | AnyCommand
AnyChannelMessage: TypeAlias = TunnelCommand | TunnelReply | TunnelReplaced | TunnelRevoked


def tag_of(cls: type[Struct]) -> str:
    return str(cls.__struct_config__.tag)


def frame_type(frame: Frame | Event | ChannelMessage) -> str:
    """The wire ``type`` of a frame, event payload or channel message."""
    return tag_of(type(frame))


def _tags(*classes: Any) -> frozenset[str]:
    return frozenset(tag_of(cls) for cls in classes)


COMMAND_TYPES = _tags(*get_args(AnyCommand))
RUNNER_FRAME_TYPES = _tags(*get_args(RunnerFrame))
SERVER_FRAME_TYPES = _tags(*get_args(ServerFrame))
EVENT_TYPES = _tags(*get_args(AnyEvent))
CHANNEL_MESSAGE_TYPES = _tags(*get_args(AnyChannelMessage))
ANSWER_TYPES = _tags(Ack, Nack, RpcResult)

_runner_decoder = msgspec.json.Decoder(RunnerFrame)
_server_decoder = msgspec.json.Decoder(ServerFrame)
_loose_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class _EventEnvelope(Struct):
    session_id: str
    seq: Seq


class _RawEventBatch(Struct):
    """An ``events`` frame with its elements left unparsed, to read them one by one."""

    events: list[msgspec.Raw]


def decode_runner_frame(data: str | bytes, *, max_depth: int = DEFAULT_FRAME_DEPTH) -> RunnerFrame:
    """Parse a frame the runner sent to the server.

    An ``event`` frame whose envelope is valid but whose payload is not (or nests deeper
    than ``max_depth``) comes back with an :class:`UnparsedEvent` payload rather than an
    error (see there). A ``hello`` for another protocol version raises
    ``unsupported_protocol`` even if its other fields are unreadable, so the consumer
    can answer it with 4002. Text that is not UTF-8 (bytes, or a ``str`` holding a
    surrogate) is ``malformed``, like any other text that is not JSON.
    """
    try:
        if is_too_deep(data, max_depth):
            return _too_deep_runner_frame(data, max_depth)
        try:
            frame = _runner_decoder.decode(data)
        except msgspec.ValidationError as exc:
            return _runner_fallback(data, exc, max_depth)
        except msgspec.DecodeError as exc:
            raise ProtocolError(MALFORMED, explain_decode_error(data, exc)) from None
    except UnicodeError as exc:  # not UTF-8, wherever it was found
        raise ProtocolError(MALFORMED, not_utf8_message(data, exc)) from None
    if type(frame) is Hello and frame.protocol != PROTOCOL_VERSION:
        raise _unsupported(frame.protocol)
    return frame


def decode_server_frame(data: str | bytes, *, max_depth: int = SERVER_FRAME_DEPTH) -> ServerFrame:
    """Parse a frame the server sent to the runner (one nesting deeper than ``max_depth``
    raises ``invalid_frame`` with its ``type`` and ``id``, so a command gets its nack)."""
    try:
        if is_too_deep(data, max_depth):
            raise _too_deep(data, max_depth, SERVER_FRAME_TYPES)
        try:
            return _server_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise _explain(data, exc, SERVER_FRAME_TYPES) from None
        except msgspec.DecodeError as exc:
            raise ProtocolError(MALFORMED, explain_decode_error(data, exc)) from None
    except UnicodeError as exc:  # not UTF-8, wherever it was found
        raise ProtocolError(MALFORMED, not_utf8_message(data, exc)) from None


def encode(frame: Frame) -> str:
    """The frame as the JSON text of one WebSocket text message."""
    return encode_bytes(frame).decode("utf-8")


def encode_bytes(frame: Frame | Event) -> bytes:
    """UTF-8 JSON of a frame or event payload (the runner sizes events with it)."""
    try:
        return _encoder.encode(frame)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(UNENCODABLE, str(exc), frame_type=frame_type(frame)) from None


def with_id(command: C, command_id: CommandId) -> C:
    """``command`` with its tunnel id set (the consumer numbers commands per tunnel)."""
    return msgspec.structs.replace(command, id=command_id)


def to_builtins(value: Struct) -> Any:
    """Plain dicts and lists (with ``type`` tags): for logs, tests and dict-based callers."""
    return msgspec.to_builtins(value)


def channel_message(message: ChannelMessage) -> dict[str, Any]:
    """The dict to hand to ``channel_layer.send`` (it carries dicts, not structs)."""
    result: dict[str, Any] = msgspec.to_builtins(message)
    return result


def decode_channel_message(message: Mapping[str, Any]) -> AnyChannelMessage:
    """Parse a channel-layer message (extra keys a layer adds are ignored)."""
    try:
        return msgspec.convert(message, AnyChannelMessage)
    except msgspec.ValidationError as exc:
        kind = message.get("type")
        raise ProtocolError(
            INVALID if kind in CHANNEL_MESSAGE_TYPES else UNKNOWN_TYPE,
            str(exc),
            frame_type=kind if isinstance(kind, str) else None,
        ) from None


def workspace_changes(payload: Mapping[str, Any]) -> WorkspaceChanges:
    """The ``workspace.changes`` event for a change tracker's payload
    (``omnigent_runner.tools.changes`` documents its shape)."""
    try:
        return msgspec.convert(payload, WorkspaceChanges)
    except msgspec.ValidationError as exc:
        raise ProtocolError(INVALID, str(exc), frame_type="workspace.changes") from None


def event_response_id(event: Event) -> str | None:
    """The turn an event belongs to, for the payloads that name one."""
    response_id = getattr(event, "response_id", None)
    return response_id if isinstance(response_id, str) else None


# --- error paths (never on the hot path) -------------------------------------------------------


def _unsupported(version: Any) -> ProtocolError:
    return ProtocolError(
        UNSUPPORTED_PROTOCOL,
        f"protocol {version!r} is not supported (this side speaks {PROTOCOL_VERSION})",
        frame_type="hello",
    )


def _runner_fallback(
    data: str | bytes, exc: msgspec.ValidationError, max_depth: int
) -> RunnerFrame:
    error = _explain(data, exc, RUNNER_FRAME_TYPES)
    if error.code != INVALID:
        raise error
    if error.frame_type == "events":
        return _event_batch_by_element(data, error, max_depth=max_depth)
    loose = _loose_decoder.decode(data)
    if error.frame_type == "hello" and not _is_version(loose.get("protocol")):
        raise _unsupported(loose.get("protocol"))
    if error.frame_type == "event":
        try:
            envelope = msgspec.convert(loose, _EventEnvelope)
        except msgspec.ValidationError:
            raise error from None
        return EventFrame(
            session_id=envelope.session_id,
            seq=envelope.seq,
            event=UnparsedEvent(raw=loose.get("event"), error=str(exc)),
        )
    raise error


def _too_deep(data: str | bytes, max_depth: int, known: frozenset[str]) -> ProtocolError:
    """The error for a frame nesting too deep, with its ``type`` and ``id`` when readable."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        head = _loose_decoder.decode(shallow(text))
    except (msgspec.DecodeError, RecursionError):
        head = None
    message = too_deep_message(max_depth)
    if not isinstance(head, dict) or not isinstance(head.get("type"), str):
        return ProtocolError(MALFORMED, message)
    kind: str = head["type"]
    raw_id = head.get("id")
    frame_id = raw_id if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    code = INVALID if kind in known else UNKNOWN_TYPE
    return ProtocolError(code, message, frame_type=kind, frame_id=frame_id)


def _too_deep_runner_frame(data: str | bytes, max_depth: int) -> RunnerFrame:
    """An ``event`` frame with a readable envelope is kept (its payload skipped, its seq
    acknowledged, as for any payload that cannot be parsed); anything else is an error."""
    error = _too_deep(data, max_depth, RUNNER_FRAME_TYPES)
    if error.frame_type == "events":
        return _event_batch_by_element(data, error, max_depth=max_depth)
    if error.frame_type != "event":
        raise error
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        envelope = msgspec.json.decode(shallow(text), type=_EventEnvelope)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise error from None
    return EventFrame(
        session_id=envelope.session_id,
        seq=envelope.seq,
        event=UnparsedEvent(raw=None, error=error.message),
    )


def _event_batch_by_element(
    data: str | bytes, error: ProtocolError, *, max_depth: int
) -> EventBatch:
    """An ``events`` frame the typed decoder refused, read element by element.

    Each element is decoded as if it had come as a frame of its own, with the same
    nesting limit, so a batch changes nothing about what is stored, skipped or acked:
    an event whose payload cannot be parsed comes back as an :class:`UnparsedEvent`
    (stored as skipped and acknowledged), and an element that is not a valid ``event``
    frame is dropped with a warning, unacknowledged, as a lone invalid frame is ignored.
    A batch whose element list itself cannot be read raises ``error``.
    """
    try:
        raw = msgspec.json.decode(data, type=_RawEventBatch)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise error from None
    events: list[EventFrame] = []
    for element in raw.events:
        try:
            frame = decode_runner_frame(bytes(element), max_depth=max_depth)
        except ProtocolError as exc:
            logger.warning("ignored an element of an events frame: %s", exc)
            continue
        if type(frame) is not EventFrame:
            logger.warning("ignored a %s frame inside an events frame", frame_type(frame))
            continue
        events.append(frame)
    return EventBatch(events=events)


def _is_version(value: Any) -> bool:
    return type(value) is int and value == PROTOCOL_VERSION


def _explain(
    data: str | bytes, exc: msgspec.ValidationError, known: frozenset[str]
) -> ProtocolError:
    """Classify a frame the typed decoder refused (the JSON itself was valid)."""
    loose = _loose_decoder.decode(data)
    if not isinstance(loose, dict) or not isinstance(loose.get("type"), str):
        return ProtocolError(MALFORMED, "a frame must be a JSON object with a string 'type'")
    kind: str = loose["type"]
    raw_id = loose.get("id")
    frame_id = raw_id if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    if kind not in known:
        return ProtocolError(
            UNKNOWN_TYPE, f"unknown frame type {kind!r}", frame_type=kind, frame_id=frame_id
        )
    return ProtocolError(INVALID, str(exc), frame_type=kind, frame_id=frame_id)
