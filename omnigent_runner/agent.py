"""The runner's :class:`SessionExecutor`: agent sessions driven by an LLM.

The tunnel client hands every session command to :class:`AgentExecutor`. Commands are
accepted (or rejected) at once; the work runs in one asyncio task per session, which
takes the session's turns one at a time in the order they arrived, each turn in a task
of its own (:class:`~omnigent_runner.turn.TurnRunner`) so ``turn.interrupt`` can cancel
it without touching the turns queued behind it.

Django-free: a runner machine has no server installed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import hashlib
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from omnigent_runner import gate, logs, protocol, workspace_rpc
from omnigent_runner.bundles import AgentSpec, BundleError, max_yaml_bytes_from, parse_bundle
from omnigent_runner.coalesce import DEFAULT_DELTA_INTERVAL_MS
from omnigent_runner.config import DEFAULT_LLM_HTTP_CLIENT
from omnigent_runner.executor import CommandRejected, EventSink
from omnigent_runner.llm import ClientPool
from omnigent_runner.mcp_servers import McpHub, McpSettings, SharedMcpServers
from omnigent_runner.protocol import AgentRef, Budgets, JsonObject, PolicyRule, Verdict
from omnigent_runner.tools.changes import ChangeTracker
from omnigent_runner.tools.tracking import make_tracker
from omnigent_runner.turn import SessionState, TurnRequest, TurnRunner

logger = logging.getLogger(__name__)

# Remembered response ids, so a re-sent turn.start never runs twice; bounded because a
# long-lived runner sees an unbounded number of turns.
_MAX_REMEMBERED_TURNS = 10_000
# How long close/shutdown wait for cancelled turns to unwind (a shell tool kills its
# process group on cancellation, which is quick but not instant).
_CANCEL_GRACE_S = 5.0
_SAFE_SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class AgentExecutor:
    """Runs agent sessions in ``workspace`` and reports them through the bound sink.

    ``env`` (default ``os.environ``) supplies ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``
    and ``OMNIGENT_DEFAULT_MODEL`` for agents whose spec leaves them out.
    ``isolate_sessions`` gives every session its own folder ``workspace/<session_id>``.
    ``ask_grace_s`` is how long past a question's ``ask_timeout`` a parked call still
    waits for the server's verdict before it is treated as cancelled.
    ``delta_interval_s`` is how often at most a streamed item's text is sent as one
    coalesced delta event (0: every delta as it comes).
    ``llm_http_client`` is the SDK's HTTP transport, ``aiohttp`` or ``httpx``
    (``llm.ClientPool``).
    """

    def __init__(
        self,
        *,
        workspace: Path,
        isolate_sessions: bool = False,
        env: Mapping[str, str] | None = None,
        llm_max_retries: int = 2,
        ask_grace_s: float = gate.DEFAULT_ASK_GRACE_S,
        delta_interval_s: float = DEFAULT_DELTA_INTERVAL_MS / 1000,
        llm_http_client: str = DEFAULT_LLM_HTTP_CLIENT,
    ) -> None:
        self._workspace = Path(workspace)
        self._isolate = isolate_sessions
        self._env: Mapping[str, str] = os.environ if env is None else env
        self._pool = ClientPool(max_retries=llm_max_retries, http_client=llm_http_client)
        self._sink: EventSink | None = None
        self._sessions: dict[str, SessionState] = {}
        self._specs: dict[tuple[str, int], AgentSpec] = {}
        self._turn_ids: OrderedDict[str, str] = OrderedDict()  # response_id -> session_id
        self._verdicts = gate.VerdictBook()
        self._ask_grace_s = ask_grace_s
        self._delta_interval_s = delta_interval_s
        self._workspace_rpc = workspace_rpc.WorkspaceRpc(self._emit)
        # Workspaces of sessions without tools (no os_env), kept for their trackers.
        self._user_workspaces: dict[str, workspace_rpc.SessionWorkspace] = {}
        # MCP servers (mcp.md): what the operator allows, and how many start at once.
        self._mcp_settings = McpSettings.from_env(self._env)
        self._mcp_starts: asyncio.Semaphore | None = None
        # Stdio servers declared ``shared: true``, one process for identical declarations.
        self._mcp_shared = SharedMcpServers()

    # --- SessionExecutor ----------------------------------------------------------------

    def bind(self, sink: EventSink) -> None:
        self._sink = sink

    def open_session_ids(self) -> list[str]:
        return list(self._sessions)

    async def open_session(
        self, *, session_id: str, agent: AgentRef, history: list[JsonObject]
    ) -> None:
        """Load the agent and history. A bad bundle is remembered, not raised: the
        session opens and each of its turns fails with ``agent_load_failed``."""
        existing = self._sessions.get(session_id)
        if existing is not None and existing.busy:
            # Our in-memory transcript is ahead of the server's copy while a turn runs.
            logger.info("session %s is already open with a turn running; keeping it", session_id)
            return
        if self._isolate and (
            not _SAFE_SESSION_ID.fullmatch(session_id) or set(session_id) == {"."}
        ):
            raise CommandRejected(
                "invalid_input", f"session id {session_id!r} cannot name a workspace folder"
            )
        spec, error = self._load_agent(agent)
        root: Path | None = None
        tracker: ChangeTracker | None = None
        if spec is not None and spec.os_env is not None:
            try:
                root = self._prepare_root(session_id, spec.os_env.cwd)
            except OSError as exc:
                spec, error = None, f"cannot prepare the tool root: {exc}"
            else:
                # A re-opened session keeps its tracker: agent_edit baselines live there.
                if existing is not None and existing.root == root:
                    tracker = existing.tracker
                else:
                    # Choosing the mode may ask git (``check-ignore``): off the event loop,
                    # which every other session on this runner shares.
                    tracker = await asyncio.to_thread(make_tracker, root=root)
        if error is not None:
            logger.warning("session %s: agent failed to load: %s", session_id, error)
        bundle = hashlib.sha256(agent.bundle_b64.encode("ascii", "replace")).hexdigest()
        mcp = await self._mcp_hub(session_id, spec, root, existing, bundle=bundle)
        self._sessions[session_id] = SessionState(
            session_id=session_id,
            spec=spec,
            load_error=error,
            history=list(history),
            root=root,
            tracker=tracker,
            policies=list(existing.policies) if existing is not None else [],
            mcp=mcp,
        )
        if existing is not None:
            # The budgets the server sent stay until it sends new ones.
            self._sessions[session_id].budgets = existing.budgets

    async def start_turn(
        self,
        *,
        session_id: str,
        response_id: str,
        input: list[JsonObject],
        tools: list[JsonObject],
    ) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            raise CommandRejected(
                "session_not_open", f"session {session_id} is not open on this runner"
            )
        if response_id in self._turn_ids:
            logger.info(
                "turn %s was already accepted; ignoring the re-sent turn.start", response_id
            )
            return
        self._turn_ids[response_id] = session_id
        while len(self._turn_ids) > _MAX_REMEMBERED_TURNS:
            self._turn_ids.popitem(last=False)
        session.queue.append(
            TurnRequest(response_id, list(input), list(tools), logs.request_id_var.get())
        )
        if session.worker is None or session.worker.done():
            session.worker = asyncio.create_task(self._work(session), name=f"session-{session_id}")

    async def tool_result(self, *, session_id: str, call_id: str, output: str) -> None:
        session = self._sessions.get(session_id)
        future = session.pending.get(call_id) if session is not None else None
        if future is None or future.done():
            logger.info(
                "tool_result for unknown call %s in session %s; ignored", call_id, session_id
            )
            return
        future.set_result(output)

    async def update_policies(self, *, session_id: str, rules: list[PolicyRule]) -> None:
        """The session's effective rules; the gate reads them at each tool call, so they
        apply from the next one, also in a running turn."""
        session = self._sessions.get(session_id)
        if session is None:
            logger.info("policy.update for session %s, which is not open; ignored", session_id)
            return
        session.policies = list(rules)

    async def update_budgets(self, *, session_id: str, budgets: Budgets) -> None:
        """The session's budget lines; checked before every model call from the next
        one, also in a running turn (usage.md, Budgets)."""
        session = self._sessions.get(session_id)
        if session is None:
            logger.info("budgets for session %s, which is not open; ignored", session_id)
            return
        session.budgets.update(budgets)

    async def approval_verdict(self, *, session_id: str, verdict: Verdict) -> None:
        """Resume the call parked on the verdict, or keep the verdict for when the call
        is reached (a call that is over never is: the verdict is then simply unused)."""
        self._verdicts.deliver(session_id, verdict)

    async def interrupt(self, *, session_id: str) -> None:
        session = self._sessions.get(session_id)
        task = session.current_task if session is not None else None
        if task is None or task.done():
            logger.info("turn.interrupt for session %s with no running turn; ignored", session_id)
            return
        task.cancel()

    async def close_session(self, *, session_id: str) -> None:
        self._user_workspaces.pop(session_id, None)
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        session.closing = True
        # Turns that never finished may be sent again if the session is reopened.
        unfinished = [request.response_id for request in session.queue]
        if session.current is not None:
            unfinished.append(session.current.response_id)
        for response_id in unfinished:
            self._turn_ids.pop(response_id, None)
        session.queue.clear()
        tasks = [
            t for t in (session.current_task, session.worker) if t is not None and not t.done()
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_GRACE_S)
        if session.mcp is not None:
            await session.mcp.close()

    async def rpc(self, *, method: str, params: dict[str, Any]) -> Any:
        if method == "ping":
            return {"pong": True}
        if method in workspace_rpc.METHODS:
            session_id = params.get("session_id")
            workspace = await self._session_workspace(session_id)
            return await self._workspace_rpc.call(
                method, params, session_id=str(session_id), workspace=workspace
            )
        raise CommandRejected("unknown_method", f"unknown rpc method {method!r}")

    async def _session_workspace(self, session_id: Any) -> workspace_rpc.SessionWorkspace:
        """The session's tool root and tracker; without ``os_env`` (no tools), the
        folder the tools would use and a tracker of its own for a person's changes."""
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise CommandRejected(
                "session_not_open", f"session {session_id!r} is not open on this runner", status=409
            )
        if session.root is not None:
            return workspace_rpc.SessionWorkspace(session.root, session.tracker)
        known = self._user_workspaces.get(session.session_id)
        if known is None:
            base = (
                self._workspace / session.session_id if self._isolate else self._workspace
            ).resolve()
            await asyncio.to_thread(base.mkdir, parents=True, exist_ok=True)
            tracker = await asyncio.to_thread(make_tracker, root=base)
            known = self._user_workspaces[session.session_id] = workspace_rpc.SessionWorkspace(
                base, tracker
            )
        return known

    async def shutdown(self) -> None:
        for session_id in list(self._sessions):
            await self.close_session(session_id=session_id)
        await self._pool.aclose()

    def session_history(self, session_id: str) -> list[dict[str, Any]]:
        """A copy of the session's transcript as the next turn would see it (for tests
        and diagnostics; raises KeyError for a session that is not open)."""
        return list(self._sessions[session_id].history)

    # --- internals ----------------------------------------------------------------------

    def _emit(self, session_id: str, event: protocol.AnyEvent) -> None:
        if self._sink is None:
            logger.warning("no event sink bound; dropping %s", protocol.frame_type(event))
            return
        self._sink.emit(session_id, event)

    def _load_agent(self, agent: AgentRef) -> tuple[AgentSpec | None, str | None]:
        """The parsed spec (cached by agent id and version) or the reason it failed."""
        key = (agent.id, agent.version)
        cached = self._specs.get(key)
        if cached is not None:
            return cached, None
        encoded = agent.bundle_b64
        if not encoded:
            return None, "session.open carried no agent bundle (bundle_b64)"
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            return None, f"the agent bundle is not valid base64: {exc}"
        try:
            # The server's cap on the agent YAML, if its operator raised it for runners too.
            spec = parse_bundle(data, max_yaml_bytes=max_yaml_bytes_from(os.environ)).spec
        except BundleError as exc:
            return None, f"invalid agent bundle: {exc}"
        except Exception as exc:  # a loader bug must not take the runner down
            logger.exception("loading agent %s version %s failed", agent.id, agent.version)
            return None, f"loading the agent bundle failed: {type(exc).__name__}: {exc}"
        self._specs[key] = spec
        return spec, None

    async def _mcp_hub(
        self,
        session_id: str,
        spec: AgentSpec | None,
        root: Path | None,
        existing: SessionState | None,
        *,
        bundle: str,
    ) -> McpHub | None:
        """The session's MCP servers, started in the background (the first turn waits
        for them). A re-opened session of the same agent keeps its running servers.
        ``bundle`` (a digest of the bundle's bytes) is part of a shared server's key."""
        old = existing.mcp if existing is not None else None
        if old is not None and existing is not None and existing.spec is spec:
            return old
        if old is not None:
            await old.close()
        if spec is None or not spec.mcp_servers:
            return None
        if root is None:
            base = self._workspace / session_id if self._isolate else self._workspace
            try:
                root = await asyncio.to_thread(_made_dir, base)
            except OSError as exc:
                logger.warning("session %s: no folder for its MCP servers: %s", session_id, exc)
                root = self._workspace
        if self._mcp_starts is None:
            self._mcp_starts = asyncio.Semaphore(self._mcp_settings.max_starts)

        def report(servers: dict[str, Any]) -> None:
            self._emit(session_id, protocol.McpStatus(servers=servers))

        hub = McpHub(
            spec.mcp_servers,
            cwd=root,
            settings=self._mcp_settings,
            env=self._env,
            report=report,
            starts=self._mcp_starts,
            shared=self._mcp_shared,
            bundle=bundle,
        )
        hub.open()
        return hub

    def _prepare_root(self, session_id: str, cwd: str) -> Path:
        """Create the session's tool root: the workspace (or the session's folder in it),
        then ``os_env.cwd`` inside that."""
        base = self._workspace / session_id if self._isolate else self._workspace
        root = (base / cwd).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root

    async def _work(self, session: SessionState) -> None:
        """Run the session's queued turns one after the other."""
        while session.queue and not session.closing:
            request = session.queue.popleft()
            emit = partial(self._emit, session.session_id)
            runner = TurnRunner(
                session,
                request,
                emit=emit,
                pool=self._pool,
                env=self._env,
                verdicts=self._verdicts,
                ask_grace_s=self._ask_grace_s,
                delta_interval_s=self._delta_interval_s,
            )
            # The turn's task logs with its session's and its request's ids
            # (omnigent_runner/logs.py); the worker itself may serve several requests.
            context = contextvars.copy_context()
            context.run(logs.session_id_var.set, session.session_id)
            context.run(logs.request_id_var.set, request.request_id)
            task = asyncio.create_task(
                runner.run(), name=f"turn-{request.response_id}", context=context
            )
            session.current, session.current_task = request, task
            try:
                # asyncio.wait, not ``await task``: a cancelled turn must not look like
                # a cancelled worker, or the queued turns behind it would be lost.
                await asyncio.wait([task])
            except asyncio.CancelledError:
                task.cancel()
                raise
            finally:
                session.current, session.current_task = None, None
            if not task.cancelled() and task.exception() is not None:
                logger.error("turn %s crashed", request.response_id, exc_info=task.exception())
            if not runner.finished and not session.closing:
                # Cancelled while it was already failing or completing: still end it.
                emit(protocol.ResponseCancelled(response_id=request.response_id))
                emit(protocol.SessionStatus(status="idle", response_id=request.response_id))


def _made_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
