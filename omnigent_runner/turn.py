"""One turn of the agent loop (agents.md, "The agent loop"), and the session state it uses.

A turn alternates model calls and tool calls until the model answers without calling a
tool. Everything the server must know goes out through ``emit`` as tunnel events
(tunnel.md, "Events"); everything the next turn must know goes into the session's
history, and the two are kept in step: an item joins the history exactly when it is
emitted as done, so a later turn (or a restarted runner, which gets the server's copy)
sees the same transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from omnigent_runner import gate, protocol
from omnigent_runner.budgets import BudgetAmounts, SessionBudgets
from omnigent_runner.bundles import AgentSpec
from omnigent_runner.coalesce import DEFAULT_DELTA_INTERVAL_MS, DeltaCoalescer
from omnigent_runner.llm import (
    TOOL_CHOICE_MODES,
    CallUsage,
    ClientPool,
    FunctionCall,
    LLMError,
    ModelRequest,
    call_model,
)
from omnigent_runner.mcp_servers import McpHub, McpOutput
from omnigent_runner.tools import sys_os
from omnigent_runner.tools.changes import ChangeTracker
from omnigent_runner.transcript import merge_tools

logger = logging.getLogger(__name__)

Item = dict[str, Any]
Emit = Callable[[protocol.AnyEvent], None]

DEFAULT_MODEL = "gpt-4o-mini"


@dataclass
class TurnRequest:
    """A ``turn.start`` the session has accepted."""

    response_id: str
    input: list[Item]
    tools: list[Item]
    # The server request that started it (``turn.start``'s ``request_id``), for its logs.
    request_id: str | None = None


@dataclass
class SessionState:
    """What the executor holds for one open session."""

    session_id: str
    spec: AgentSpec | None
    load_error: str | None  # why the agent could not load; every turn then fails
    history: list[Item]
    root: Path | None  # the sys_os tool root (only with os_env)
    tracker: ChangeTracker | None  # only with os_env
    pending: dict[str, asyncio.Future[str]] = field(default_factory=dict)  # parked client calls
    queue: deque[TurnRequest] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    current: TurnRequest | None = None
    current_task: asyncio.Task[None] | None = None
    closing: bool = False  # set by close/shutdown: the turn must stop without events
    # The effective policy rules (session.open, policy.update); read at every tool call.
    policies: list[protocol.PolicyRule] = field(default_factory=list)
    # The session's MCP servers (mcp.md), when its bundle declares any.
    mcp: McpHub | None = None
    # The latest budget lines (session.open, turn.start, policy.update); read before
    # every model call (usage.md, Budgets).
    budgets: SessionBudgets = field(default_factory=SessionBudgets)

    @property
    def busy(self) -> bool:
        return bool(self.queue) or (self.worker is not None and not self.worker.done())


class TurnFailed(Exception):
    """Ends the turn as ``failed`` with ``code`` (agents.md failure codes)."""

    def __init__(self, code: str, message: str, *, budget: BudgetAmounts | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # A ``budget_exceeded`` failure's budget, sent in the error beside the message.
        self.budget = budget


def new_item_id() -> str:
    return "item_" + uuid.uuid4().hex


class TurnRunner:
    """Runs one :class:`TurnRequest` of a session to a terminal event.

    ``run`` never raises except ``CancelledError``: every outcome is reported as
    ``response.completed``, ``response.failed`` or ``response.cancelled``.
    ``delta_interval_s``: an item's streamed text goes out as at most one delta event per
    interval (:mod:`omnigent_runner.coalesce`), the first at once; 0 sends every delta.
    """

    def __init__(
        self,
        session: SessionState,
        request: TurnRequest,
        *,
        emit: Emit,
        pool: ClientPool,
        env: Mapping[str, str],
        verdicts: gate.VerdictBook | None = None,
        ask_grace_s: float = gate.DEFAULT_ASK_GRACE_S,
        delta_interval_s: float = DEFAULT_DELTA_INTERVAL_MS / 1000,
    ) -> None:
        self.session = session
        self.request = request
        self.finished = False  # a terminal event was emitted
        self._emit_raw = emit
        self._pool = pool
        self._env = env
        self._rid = request.response_id
        self._call_item_ids: dict[str, str] = {}
        # Built-in calls emitted as done whose output is not out yet: settled on failure.
        self._unanswered: dict[str, FunctionCall] = {}
        self._timer: asyncio.Timeout | None = None  # the turn's deadline (paused while asking)
        # Text deltas go out through here; every other event flushes it first (``_emit``).
        self._deltas = DeltaCoalescer(send=self._send_delta, interval_s=delta_interval_s)
        self._policy = gate.PolicyGate(
            session_id=session.session_id,
            response_id=request.response_id,
            emit=self._emit,
            verdicts=verdicts if verdicts is not None else gate.VerdictBook(),
            ask_grace_s=ask_grace_s,
            pause=self._deadline_paused,
        )

    # --- outcome ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            # However the turn ended (also cancelled while closing, or crashed), no
            # buffered text is left behind and no timer fires after it.
            self._deltas.flush()

    async def _run(self) -> None:
        logger.info("turn %s of session %s started", self._rid, self.session.session_id)
        self._status("running")
        self._emit(protocol.ResponseCreated(response_id=self._rid))
        timer: asyncio.Timeout | None = None
        try:
            self._add_input()
            spec = self._spec()
            timer = self._timer = asyncio.timeout(spec.timeout)
            async with timer:
                await self._loop(spec)
        except asyncio.CancelledError:
            if not self.session.closing:
                self._settle_unanswered("the turn was cancelled before the tool finished")
                self._finish(protocol.ResponseCancelled(response_id=self._rid), "idle")
            raise
        except TimeoutError:
            if timer is None or not timer.expired():
                logger.exception("turn %s: unexpected TimeoutError", self._rid)
                await self._fail("internal_error", "unexpected timeout inside the turn")
            else:
                limit = self.session.spec.timeout if self.session.spec else 0
                await self._fail("timeout", f"the turn did not finish within {limit:g} seconds")
        except TurnFailed as exc:
            await self._fail(exc.code, exc.message, budget=exc.budget)
        except LLMError as exc:
            await self._fail(exc.code, exc.message)
        except Exception as exc:
            logger.exception("turn %s of session %s failed", self._rid, self.session.session_id)
            await self._fail("internal_error", f"{type(exc).__name__}: {exc}")
        else:
            await self._report_turn_end()
            self._finish(protocol.ResponseCompleted(response_id=self._rid), "idle")

    def _spec(self) -> AgentSpec:
        if self.session.spec is None:
            raise TurnFailed(
                "agent_load_failed", self.session.load_error or "the agent is not loaded"
            )
        return self.session.spec

    async def _fail(self, code: str, message: str, *, budget: BudgetAmounts | None = None) -> None:
        logger.info("turn %s failed: %s: %s", self._rid, code, message)
        self._settle_unanswered(f"the turn failed before the tool finished ({code})")
        await self._report_turn_end()
        error = (
            protocol.ErrorInfo(code=code, message=message)
            if budget is None
            else protocol.ErrorInfo(code=code, message=message, **budget)
        )
        self._finish(protocol.ResponseFailed(response_id=self._rid, error=error), "failed")

    def _finish(self, terminal: protocol.TurnEnd, status: protocol.StatusName) -> None:
        self._emit(terminal)
        self._status(status, error=terminal.error)
        self.finished = True

    async def _report_turn_end(self) -> None:
        """Emit the tracker's end-of-turn change set; tracking never fails a turn."""
        if self.session.tracker is None:
            return
        try:
            payload = await self.session.tracker.turn_end()
        except Exception:
            logger.exception("change tracking failed at the end of turn %s", self._rid)
            return
        if payload is not None:
            self._emit(protocol.workspace_changes(payload))

    def _settle_unanswered(self, reason: str) -> None:
        """Give every built-in call already reported done an (error) output.

        The call item is stored on the server, so the transcript needs its output;
        otherwise every later model request would carry a dangling call.
        """
        for call in list(self._unanswered.values()):
            self._output(call, json.dumps({"error": reason}))

    # --- the loop -----------------------------------------------------------------------

    def _add_input(self) -> None:
        """Append the turn's input items, skipping those the history already holds.

        After a runner restart the server re-sends ``turn.start`` for a turn whose user
        message is already in the stored history: it must not appear twice.
        """
        known = {item.get("id") for item in self.session.history if item.get("id")}
        for item in self.request.input:
            if not isinstance(item, dict) or (item.get("id") and item["id"] in known):
                continue
            self.session.history.append(item)
            if item.get("id"):
                known.add(item["id"])

    def _tools(self, spec: AgentSpec) -> tuple[list[Item], set[str], set[str]]:
        """This model call's tools: ``sys_os_*``, the ready MCP servers' tools, then the
        client's (a built-in name wins a clash); the built-in and client name sets."""
        builtin = sys_os.tool_definitions() if spec.os_env is not None else []
        if self.session.mcp is not None:
            builtin += [tool.definition() for tool in self.session.mcp.tools()]
        builtin_names = {tool["function"]["name"] for tool in builtin}
        tools, client_names = merge_tools(builtin, self.request.tools)
        return tools, builtin_names, client_names

    async def _loop(self, spec: AgentSpec) -> None:
        if self.session.mcp is not None:
            # Servers still starting are waited for (each start is bounded); failed
            # ones get their one restart of this turn.
            await self.session.mcp.begin_turn()
        tools, builtin_names, client_names = self._tools(spec)
        client = self._pool.get(
            api_key=spec.api_key or self._env.get("OPENAI_API_KEY") or "not-set",
            base_url=spec.base_url or self._env.get("OPENAI_BASE_URL") or None,
        )
        model = spec.model or self._env.get("OMNIGENT_DEFAULT_MODEL") or DEFAULT_MODEL
        tool_choice = _tool_choice(spec.tool_choice, tools)
        await self._resume_asked_calls(builtin_names)
        for iteration in range(spec.max_iterations):
            if iteration and self.session.mcp is not None:
                # A server that died since the last call has no tools in this one.
                tools, builtin_names, client_names = self._tools(spec)
            request = ModelRequest(
                api=spec.api,
                model=model,
                instructions=spec.prompt,
                history=list(self.session.history),
                tools=tools,
                tool_choice=tool_choice,
            )
            await self._check_budget(spec)
            calls = await self._ask_model(client, request)
            if not calls:
                return
            if tool_choice not in (None, "auto", "none"):
                # Forced once is enough: forced again, the model would call a tool after
                # every tool output and never answer (and llama-cpp-python refuses a
                # streamed ``auto``), so the follow-ups leave the choice to the server.
                tool_choice = None
            await self._run_calls(calls, builtin_names, client_names)
        raise TurnFailed(
            "max_iterations_exceeded",
            f"the agent still called tools after {spec.max_iterations} model calls "
            "(executor.max_iterations)",
        )

    async def _check_budget(self, spec: AgentSpec) -> None:
        """Before every model call: a spent budget stops the turn (``deny``) or asks a
        person to raise it (``ask``), until no line is spent (usage.md, Budgets). The
        numbers are the server's latest, so a call may start before the previous one is
        counted: one call per turn is the most a budget is overshot by."""
        guardrails = spec.guardrails
        while (overrun := self.session.budgets.overrun(guardrails)) is not None:
            if overrun.denies:
                logger.info("turn %s: stopped, %s", self._rid, overrun.describe())
                raise TurnFailed("budget_exceeded", overrun.describe(), budget=overrun.amounts())
            logger.info("turn %s: asking to raise the budget, %s", self._rid, overrun.describe())
            verdict = await self._policy.ask_budget(
                params=overrun.params(),
                reason=overrun.describe(),
                ask_timeout=guardrails.ask_timeout,
            )
            if verdict.action != "accept":
                answer = "declined" if verdict.action == "decline" else "not approved"
                raise TurnFailed(
                    "budget_exceeded",
                    f"{overrun.describe()}; raising it was {answer}",
                    budget=overrun.amounts(),
                )
            self.session.budgets.accept(overrun)

    async def _ask_model(
        self, client: openai.AsyncOpenAI, request: ModelRequest
    ) -> list[FunctionCall]:
        """One model call: stream its text up, report its message, return its calls."""
        message_id = new_item_id()
        streamed: list[str] = []

        def on_delta(delta: str) -> None:
            if delta:
                streamed.append(delta)
                self._delta(message_id, delta)

        usage = CallUsage()
        try:
            answer = await call_model(client, request, on_delta, usage)
        except BaseException as exc:
            if isinstance(exc, LLMError):
                self._keep_partial_text(message_id, "".join(streamed))
            # Every call the provider answered is counted, also one that failed or was
            # interrupted part way (usage.md: such turns count what their calls used).
            self._report_usage(usage, requested=request.model)
            raise
        if answer.text:
            if not streamed:
                self._delta(message_id, answer.text)
            self._done(
                {
                    "id": message_id,
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer.text}],
                }
            )
        self._report_usage(usage, requested=request.model)
        return answer.calls

    def _report_usage(self, usage: CallUsage, *, requested: str) -> None:
        """One ``usage.recorded`` per model call the provider answered; the server prices
        and totals it."""
        if not usage.sent:
            return
        self._emit(
            protocol.UsageRecorded(
                response_id=self._rid,
                model=usage.model or requested,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_read_input_tokens=usage.cache_read_input_tokens,
                cache_creation_input_tokens=usage.cache_creation_input_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                reported=usage.reported,
            )
        )

    def _keep_partial_text(self, message_id: str, text: str) -> None:
        """Store the text a failed model call had already streamed, as an ``incomplete``
        assistant message (the Responses API's word for an answer cut short): watchers
        saw it, so the transcript keeps it too."""
        if not text:
            return
        self._done(
            {
                "id": message_id,
                "type": "message",
                "status": "incomplete",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        )

    async def _start_calls(
        self,
        calls: list[FunctionCall],
        builtin_names: set[str],
        client_names: set[str],
        parked: dict[asyncio.Future[str], FunctionCall],
    ) -> None:
        """Each call in order through the policy gate: run a built-in one, park a client
        one (into ``parked``), or give it its refusal as output."""
        for call in calls:
            arguments, problem = _arguments(call)
            if call.name in client_names:
                # The policy gate comes first: the client runs the call once it sees it.
                refusal = await self._gate(call, arguments or {})
                if refusal is not None:
                    self._done(self._call_item(call, "completed"))
                    self._output(call, refusal)
                    continue
                self._emit_item(self._call_item(call, "action_required"))
                future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
                self.session.pending[call.call_id] = future
                parked[future] = call
                continue
            self._done(self._call_item(call, "completed"))
            self._unanswered[call.call_id] = call
            if call.name not in builtin_names and not self._is_mcp(call.name):
                self._output(call, _json({"error": f"unknown tool '{call.name}'"}))
            elif arguments is None:
                self._output(call, _json({"error": problem}))  # nothing would run: nothing to ask
            else:
                await self._finish_builtin(call, arguments)

    async def _finish_builtin(self, call: FunctionCall, arguments: dict[str, Any]) -> None:
        """Gate a reported built-in call, run it if allowed, and report its output."""
        refusal = await self._gate(call, arguments)
        if refusal is not None:
            self._output(call, refusal)
            return
        if self._is_mcp(call.name):
            output = await self._run_mcp(call, arguments)
            self._output(call, output.text, images=output.images)
            return
        result, changes = await self._run_builtin(call, arguments)
        self._output(call, _json(result))
        if changes is not None:
            self._emit(protocol.workspace_changes(changes))

    async def _run_calls(
        self, calls: list[FunctionCall], builtin_names: set[str], client_names: set[str]
    ) -> None:
        """Run built-in calls in order; park on client calls, then wait for all of them."""
        parked: dict[asyncio.Future[str], FunctionCall] = {}
        try:
            await self._start_calls(calls, builtin_names, client_names, parked)
        except BaseException:
            # Interrupted while a later call ran or waited for its verdict.
            self._unpark(parked)
            raise
        if parked:
            await self._wait_for_client(parked)

    # --- the policy gate (approvals.md) -----------------------------------------------------

    async def _gate(self, call: FunctionCall, arguments: dict[str, Any]) -> str | None:
        """None to run the call, else the refusal the model sees as its output. An
        interrupt while the call waits for a verdict answers it ``not approved``."""
        try:
            return await self._policy.check(self.session.policies, call=call, arguments=arguments)
        except asyncio.CancelledError:
            if call.call_id in self._unanswered and not self.session.closing:
                self._output(call, gate.not_approved_output())
            raise

    @contextlib.contextmanager
    def _deadline_paused(self) -> Iterator[None]:
        """Stop the turn's clock while a call waits for a person: their thinking time is
        not the agent's run time (``executor.timeout``)."""
        timer = self._timer
        deadline = timer.when() if timer is not None else None
        if timer is None or deadline is None:
            yield
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        timer.reschedule(None)
        try:
            yield
        finally:
            timer.reschedule(deadline + (loop.time() - started))

    async def _resume_asked_calls(self, builtin_names: set[str]) -> None:
        """A turn re-run after a runner restart: built-in calls of this turn that were
        reported but have no output, and that the rules still ``ask`` about, were waiting
        for a person. They are asked again under the same ``call_id`` (the server answers
        from its stored verdict, so nobody is asked twice) instead of asking the model
        for a new call. Other unfinished calls stay out of the model's view as before."""
        answered = {
            item.get("call_id")
            for item in self.session.history
            if item.get("type") == "function_call_output"
        }
        for item in list(self.session.history):
            if (
                item.get("type") != "function_call"
                or item.get("response_id") != self._rid
                or item.get("call_id") in answered
                or (
                    item.get("name") not in builtin_names
                    and not self._is_mcp(str(item.get("name")))
                )
                or not isinstance(item.get("call_id"), str)
            ):
                continue
            call = FunctionCall(
                call_id=item["call_id"], name=item["name"], arguments=item.get("arguments") or ""
            )
            arguments, _ = _arguments(call)
            if arguments is None or not self._policy.would_ask(
                self.session.policies, call=call, arguments=arguments
            ):
                continue
            logger.info(
                "turn %s: resuming call %s, asked before a restart", self._rid, call.call_id
            )
            if isinstance(item.get("id"), str):
                self._call_item_ids[call.call_id] = item["id"]
            self._unanswered[call.call_id] = call
            await self._finish_builtin(call, arguments)

    def _is_mcp(self, name: str) -> bool:
        return self.session.mcp is not None and self.session.mcp.owns(name)

    async def _run_mcp(self, call: FunctionCall, arguments: dict[str, Any]) -> McpOutput:
        """An MCP tool call; its server's questions go to a person as approvals."""
        assert self.session.mcp is not None
        found = self.session.mcp.find(call.name)
        if found is None:
            return McpOutput(text=_json({"error": f"unknown tool '{call.name}'"}))
        server, tool = found

        spec = self._spec()

        async def elicit(
            message: str, schema: dict[str, Any]
        ) -> tuple[gate.ElicitAction, dict[str, Any] | None]:
            return await self._policy.elicit(
                call=call,
                arguments=arguments,
                message=message,
                schema=schema,
                ask_timeout=spec.guardrails.ask_timeout,
            )

        return await server.call(tool, arguments, name=call.name, elicit=elicit)

    async def _run_builtin(
        self, call: FunctionCall, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if self.session.tracker is not None:
            return await self.session.tracker.run_tool(call.name, arguments)
        assert self.session.root is not None  # built-ins exist only with os_env
        return await sys_os.run_tool(call.name, arguments, root=self.session.root), None

    async def _wait_for_client(self, parked: dict[asyncio.Future[str], FunctionCall]) -> None:
        """Session ``waiting`` until every parked call has its ``tool_result``.

        Each result is reported as it arrives (call completed, then its output). A
        cancelled or timed-out wait leaves the unanswered calls out of the history: the
        server never stored them (it stores a client call only once completed).
        """
        self._status("waiting")
        waiting = dict(parked)
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in [f for f in waiting if f in done]:
                    call = waiting.pop(future)
                    self._done(self._call_item(call, "completed"))
                    self._output(call, future.result())
        finally:
            self._unpark(parked)
        self._status("running")

    def _unpark(self, parked: dict[asyncio.Future[str], FunctionCall]) -> None:
        for future, call in parked.items():
            if self.session.pending.get(call.call_id) is future:
                del self.session.pending[call.call_id]
            future.cancel()

    # --- items and events ---------------------------------------------------------------

    def _call_item(self, call: FunctionCall, status: str) -> Item:
        item_id = self._call_item_ids.setdefault(call.call_id, new_item_id())
        return {
            "id": item_id,
            "type": "function_call",
            "status": status,
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        }

    def _output(self, call: FunctionCall, output: str, *, images: Sequence[Item] = ()) -> None:
        """Report a call's output. ``images`` (an MCP tool's, as ``input_image`` parts)
        ride along in the item's ``images``; the text holds a placeholder for each."""
        self._unanswered.pop(call.call_id, None)
        # The call is finished: a later call that reuses its id (some servers number
        # calls per answer, "call_0" each time) is another item, not this one again.
        self._call_item_ids.pop(call.call_id, None)
        item: Item = {
            "id": new_item_id(),
            "type": "function_call_output",
            "status": "completed",
            "call_id": call.call_id,
            "output": output,
        }
        if images:
            item["images"] = [dict(image) for image in images]
        self._done(item)

    def _done(self, item: Item) -> None:
        """Report a finished item and add it to the history (the two always go together)."""
        self.session.history.append(item)
        self._emit_item(item)

    def _emit_item(self, item: Item) -> None:
        self._emit(protocol.OutputItemDone(response_id=self._rid, item=item))

    def _delta(self, item_id: str, delta: str) -> None:
        """Stream text of ``item_id``; the coalescer decides when it goes out."""
        self._deltas.add(item_id, delta)

    def _send_delta(self, item_id: str, delta: str) -> None:
        if not self.session.closing:
            self._emit_raw(
                protocol.OutputTextDelta(response_id=self._rid, item_id=item_id, delta=delta)
            )

    def _status(
        self, status: protocol.StatusName, *, error: protocol.ErrorInfo | None = None
    ) -> None:
        self._emit(protocol.SessionStatus(status=status, response_id=self._rid, error=error))

    def _emit(self, event: protocol.AnyEvent) -> None:
        """Send any event but a text delta: buffered text goes first, keeping the order."""
        self._deltas.flush()
        if not self.session.closing:
            self._emit_raw(event)


def _tool_choice(choice: str | None, tools: list[Item]) -> str | None:
    """The bundle's ``tool_choice`` for this turn's tools. A tool name must be one of
    them (a client tool is known only now); with no tools there is nothing to choose."""
    if choice is None or not tools:
        return None
    names = [tool["function"]["name"] for tool in tools]
    if choice in TOOL_CHOICE_MODES or choice in names:
        return choice
    raise TurnFailed(
        "agent_load_failed",
        f"executor.tool_choice names the tool {choice!r}, which this turn does not offer "
        f"(its tools: {', '.join(names)})",
    )


def _arguments(call: FunctionCall) -> tuple[dict[str, Any] | None, str]:
    """The call's arguments as the JSON object the tool runs with, or why they are not."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError as exc:
        return None, f"tool arguments are not valid JSON: {exc}"
    if not isinstance(arguments, dict):
        return None, "tool arguments must be a JSON object"
    return arguments, ""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
