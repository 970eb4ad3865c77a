"""The seam between the tunnel client and whatever runs agents.

The tunnel client (``omnigent_runner.tunnel``) owns the WebSocket: it acknowledges
commands, numbers and buffers events, and resends them after a reconnect. It hands
every session command to a :class:`SessionExecutor` and gives the executor an
:class:`EventSink` to report what happens. Keeping this seam small lets the agent
loop be tested without a socket and the tunnel be tested without an LLM.

Commands arrive and events leave as the typed frames of ``omnigent_runner.protocol``;
the tunnel client turns :class:`CommandRejected` into the ``nack``.

This module imports no Django: the runner runs on machines without the server.
"""

from __future__ import annotations

from typing import Any, Protocol

from omnigent_runner.protocol import AgentRef, AnyEvent, Budgets, JsonObject, PolicyRule, Verdict


class CommandRejected(Exception):
    """Raised by an executor to ``nack`` a command with a code and a message.

    ``status`` (an rpc's error only): the HTTP status the server should answer with.
    """

    def __init__(self, code: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class EventSink(Protocol):
    """Where an executor reports session events (the event payloads of the protocol module).

    ``emit`` numbers the event with the session's next ``seq``, keeps it until the
    server acknowledges it, and sends it when the tunnel is up. It never blocks on
    the network, so an executor may call it from its turn task at any time.
    """

    def emit(self, session_id: str, event: AnyEvent) -> None: ...


class SessionExecutor(Protocol):
    """Runs the sessions a runner is asked to run.

    Every method is called from the tunnel client's event loop and must return
    quickly: accepting a command (so the tunnel can ``ack`` it) is separate from
    doing the work, which runs in tasks the executor owns. Raise
    :class:`CommandRejected` to ``nack`` a command.
    """

    def bind(self, sink: EventSink) -> None:
        """Called once, before any other method, with the sink for events."""

    def open_session_ids(self) -> list[str]:
        """Sessions whose state (agent and history) this executor holds."""

    async def open_session(
        self, *, session_id: str, agent: AgentRef, history: list[JsonObject]
    ) -> None:
        """``session.open``: load the agent and history."""

    async def start_turn(
        self,
        *,
        session_id: str,
        response_id: str,
        input: list[JsonObject],
        tools: list[JsonObject],
    ) -> None:
        """``turn.start``: start the turn, or queue it behind the running one.

        A ``response_id`` the executor already runs or has finished is accepted and
        ignored, so a re-sent ``turn.start`` never runs a turn twice.
        """

    async def tool_result(self, *, session_id: str, call_id: str, output: str) -> None:
        """``tool_result``: resume the turn parked on ``call_id`` (unknown ids are ignored)."""

    async def update_policies(self, *, session_id: str, rules: list[PolicyRule]) -> None:
        """``policy.update`` and ``session.open.policies``: the session's effective rules,
        applied from its next tool call (a session that is not open is ignored)."""

    async def update_budgets(self, *, session_id: str, budgets: Budgets) -> None:
        """``budgets`` of ``session.open``, ``turn.start`` and ``policy.update`` (sent
        only when the frame carries them): the session's budget lines, checked before
        every LLM call from the next one (a session that is not open is ignored)."""

    async def approval_verdict(self, *, session_id: str, verdict: Verdict) -> None:
        """``approval.verdict`` and each of ``session.open.verdicts``: resume the call
        parked on it, or keep it until that call is reached (never asked twice)."""

    async def interrupt(self, *, session_id: str) -> None:
        """``turn.interrupt``: cancel the running turn, which ends ``cancelled``; a call
        waiting for a verdict gets ``not approved`` as its output first."""

    async def close_session(self, *, session_id: str) -> None:
        """``session.close``: cancel anything running and drop the session's state."""

    async def rpc(self, *, method: str, params: dict[str, Any]) -> Any:
        """``rpc``: answer a request; raise :class:`CommandRejected` for errors."""

    async def shutdown(self) -> None:
        """Cancel every task; called once when the runner stops."""
