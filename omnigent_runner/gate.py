"""The runner's side of approvals (approvals.md): verdicts, parked calls, refusal outputs.

Before every tool call the turn asks :func:`omnigent_runner.policies.decide`; an ``ask``
parks the call on a future here until the server's ``approval.verdict`` arrives. Verdicts
are keyed by ``(session_id, response_id, call_id)``, the key the server stores approvals
under, so a verdict that arrives *before* its call is parked (the server answering a
re-run turn from its stored verdict, or ``session.open.verdicts`` after a reconnect) is
kept and applied when that call is reached: nothing is asked twice.

The runner never decides that a question expired (the server owns the deadline and sends
``cancel`` with ``unanswered``); it only bounds its own wait so a lost verdict cannot hold
a turn forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeAlias

from omnigent_runner import protocol
from omnigent_runner.llm import FunctionCall
from omnigent_runner.policies import DEFAULT_ASK_TIMEOUT, decide
from omnigent_runner.protocol import PolicyRule, Verdict

logger = logging.getLogger(__name__)

Key: TypeAlias = tuple[str, str, str]  # (session_id, response_id, call_id)
ElicitAction: TypeAlias = Literal["accept", "decline", "cancel"]

# Verdicts kept for calls not (or no longer) parked; bounded like the remembered turns.
MAX_EARLY_VERDICTS = 10_000
# How long past its ask_timeout the runner still waits for the server's verdict.
DEFAULT_ASK_GRACE_S = 300.0
NOT_APPROVED = "not approved"


class VerdictBook:
    """Parked calls waiting for a verdict, and verdicts that came before their call.

    One per executor, shared by its sessions' turns; used from the event loop only.
    """

    def __init__(self, *, max_early: int = MAX_EARLY_VERDICTS) -> None:
        self._parked: dict[Key, asyncio.Future[Verdict]] = {}
        self._early: OrderedDict[Key, Verdict] = OrderedDict()
        self._max_early = max_early

    def deliver(self, session_id: str, verdict: Verdict) -> bool:
        """Resolve the parked call the verdict answers (True), or keep it for later."""
        key = (session_id, verdict.response_id, verdict.call_id)
        future = self._parked.get(key)
        if future is not None:
            if not future.done():
                future.set_result(verdict)
            return True
        logger.info(
            "verdict %s for call %s of turn %s arrived before the call was parked; kept",
            verdict.action,
            verdict.call_id,
            verdict.response_id,
        )
        self._early[key] = verdict
        self._early.move_to_end(key)
        while len(self._early) > self._max_early:
            self._early.popitem(last=False)
        return False

    def take(self, key: Key) -> Verdict | None:
        """The verdict that arrived before ``key`` was parked (used once)."""
        return self._early.pop(key, None)

    def park(self, key: Key) -> asyncio.Future[Verdict]:
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._parked[key] = future
        return future

    def release(self, key: Key, future: asyncio.Future[Verdict]) -> None:
        if self._parked.get(key) is future:
            del self._parked[key]
        future.cancel()

    def parked_keys(self) -> list[Key]:
        """The calls waiting for a verdict (for tests and diagnostics)."""
        return list(self._parked)


class PolicyGate:
    """The policy check of one turn's tool calls.

    ``emit`` sends the turn's events; ``pause`` is a context manager the gate holds
    while a call waits for a person (the turn stops its own deadline there).
    """

    def __init__(
        self,
        *,
        session_id: str,
        response_id: str,
        emit: Callable[[protocol.AnyEvent], None],
        verdicts: VerdictBook,
        ask_grace_s: float = DEFAULT_ASK_GRACE_S,
        pause: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._session_id = session_id
        self._rid = response_id
        self._emit = emit
        self._verdicts = verdicts
        self._ask_grace_s = ask_grace_s
        self._pause = pause
        self._questions: dict[str, int] = {}  # call_id -> MCP questions asked so far
        self._budget_questions = 0  # budget questions of this turn so far

    def would_ask(
        self, rules: Sequence[PolicyRule], *, call: FunctionCall, arguments: Mapping[str, Any]
    ) -> bool:
        return decide(rules, tool=call.name, arguments=arguments).action == "ask"

    async def check(
        self, rules: Sequence[PolicyRule], *, call: FunctionCall, arguments: dict[str, Any]
    ) -> str | None:
        """None to run the call (no rule, ``allow``, or an accepted question), else the
        refusal the model sees as the call's output."""
        decision = decide(rules, tool=call.name, arguments=arguments)
        rule = decision.rule
        if rule is None or decision.action == "allow":
            return None
        if decision.action == "deny":
            logger.info("turn %s: policy %r denied %s", self._rid, rule.name, call.name)
            self._emit(
                protocol.PolicyDenied(
                    response_id=self._rid,
                    call_id=call.call_id,
                    tool=call.name,
                    policy_name=rule.name,
                    reason=rule.reason or "",
                )
            )
            return deny_output(rule)
        verdict = await self._ask(call, arguments, rule)
        return None if verdict.action == "accept" else refusal_output(verdict)

    async def elicit(
        self,
        *,
        call: FunctionCall,
        arguments: dict[str, Any],
        message: str,
        schema: dict[str, Any],
        ask_timeout: float | None,
    ) -> tuple[ElicitAction, dict[str, Any] | None]:
        """An MCP server's question during ``call`` (mcp.md), asked as an approval with
        no rule: ``(action, content)``, the content (accepted only) as the server
        checked it against ``schema``. Each question of a call has its own id
        (``<call_id>#q<n>``), so a re-run turn is answered from the stored verdict."""
        count = self._questions.get(call.call_id, 0) + 1
        self._questions[call.call_id] = count
        question = FunctionCall(
            call_id=f"{call.call_id}#q{count}", name=call.name, arguments=call.arguments
        )
        verdict = await self._park(
            question,
            protocol.ApprovalRequested(
                response_id=self._rid,
                call_id=question.call_id,
                tool=call.name,
                arguments=arguments,
                policy_name="",
                reason="",
                ask_timeout=ask_timeout or DEFAULT_ASK_TIMEOUT,
                elicitation={"message": message, "requestedSchema": schema},
            ),
        )
        if verdict.action == "accept":
            return "accept", dict(verdict.content or {})
        return verdict.action, None

    async def ask_budget(
        self, *, params: dict[str, Any], reason: str, ask_timeout: float | None
    ) -> Verdict:
        """A spent budget before a model call (usage.md), asked like a tool call: the
        same events, wait, deadline pause and interrupt. There is no call, so each
        question of the turn has the id ``budget_<n>``; a turn re-run after a restart
        asks in the same order, so the server answers from its stored verdict."""
        self._budget_questions += 1
        question = FunctionCall(call_id=f"budget_{self._budget_questions}", name="", arguments="")
        return await self._park(
            question,
            protocol.ApprovalRequested(
                response_id=self._rid,
                call_id=question.call_id,
                tool="",
                arguments=params,
                policy_name="budget",
                reason=reason,
                ask_timeout=ask_timeout or DEFAULT_ASK_TIMEOUT,
                phase="budget",
            ),
        )

    async def _ask(
        self, call: FunctionCall, arguments: dict[str, Any], rule: PolicyRule
    ) -> Verdict:
        """Raise the question (unless its verdict is already here) and park the call
        until the verdict comes; past ``ask_timeout`` + grace it counts as ``cancel``."""
        return await self._park(
            call,
            protocol.ApprovalRequested(
                response_id=self._rid,
                call_id=call.call_id,
                tool=call.name,
                arguments=arguments,
                policy_name=rule.name,
                reason=rule.reason or "",
                ask_timeout=rule.ask_timeout or DEFAULT_ASK_TIMEOUT,
            ),
        )

    async def _park(self, call: FunctionCall, question: protocol.ApprovalRequested) -> Verdict:
        key = (self._session_id, self._rid, call.call_id)
        known = self._verdicts.take(key)
        if known is not None:
            logger.info("turn %s: call %s already has verdict %s", self._rid, key[2], known.action)
            return known
        ask_timeout = question.ask_timeout
        self._emit(question)
        future = self._verdicts.park(key)
        bound = ask_timeout + self._ask_grace_s
        try:
            with self._pause():
                async with asyncio.timeout(bound):
                    return await future
        except TimeoutError:
            logger.warning(
                "turn %s: no verdict for call %s within %.0f s; treated as cancel",
                self._rid,
                call.call_id,
                bound,
            )
            return Verdict(
                elicitation_id="",
                response_id=self._rid,
                call_id=call.call_id,
                action="cancel",
                reason="unanswered",
            )
        finally:
            self._verdicts.release(key, future)


def deny_output(rule: PolicyRule) -> str:
    """What the model sees for a call a ``deny`` rule stopped."""
    return _error(f"denied by policy {rule.name}: {rule.reason or 'no reason'}")


def refusal_output(verdict: Verdict) -> str:
    """What the model sees for a declined or cancelled (or expired) question."""
    if verdict.action == "decline":
        who = verdict.resolved_by or "unknown"
        return _error(f"declined by {who}: {verdict.reason or 'no reason'}")
    return _error(NOT_APPROVED)


def not_approved_output() -> str:
    return _error(NOT_APPROVED)


def _error(message: str) -> str:
    # The same encoding as every other tool output (turn.py).
    return json.dumps({"error": message}, ensure_ascii=False)
