"""A stand-in for the relay in the workspace API tests: the real runner code, no tunnel.

``FakeWorkspaceRunner.send_command`` replaces ``runners.workspace_relay.send_command``:
it answers ``workspace.*`` rpc with the runner's own :class:`WorkspaceRpc` on a
temporary folder (so confinement, listing order and the error statuses are the real
ones), and every answer goes through the protocol's encoder as it would on the wire.
``offline=True`` makes it fail as a runner that never answers does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from omnigent_runner import protocol
from omnigent_runner.executor import CommandRejected
from omnigent_runner.tools.agent_edit import AgentEditTracker
from omnigent_runner.workspace_rpc import SessionWorkspace, WorkspaceRpc
from runners.relay import RelayError


class FakeWorkspaceRunner:
    def __init__(self, root: Path, *, offline: bool = False) -> None:
        self.root = root
        self.offline = offline
        self.tracker = AgentEditTracker(root)
        self.commands: list[protocol.AnyCommand] = []
        self.events: list[tuple[str, protocol.AnyEvent]] = []
        self.rpc = WorkspaceRpc(lambda session_id, event: self.events.append((session_id, event)))

    async def send_command(
        self, *, channel_name: str, command: protocol.AnyCommand, timeout: float | None = None
    ) -> protocol.TunnelReply:
        self.commands.append(command)
        if self.offline:
            raise RelayError("runner_timeout", "the runner did not acknowledge within 10 s")
        if not isinstance(command, protocol.Rpc):
            return protocol.TunnelReply(ok=True)
        params = dict(command.params)
        workspace = SessionWorkspace(self.root, self.tracker)
        try:
            result: Any = await self.rpc.call(
                command.method, params, session_id=str(params["session_id"]), workspace=workspace
            )
        except CommandRejected as exc:
            raise RelayError(exc.code, exc.message, status=exc.status) from None
        wire = protocol.encode(protocol.RpcResult(id="cmd-1-1", ok=True, result=result))
        return protocol.TunnelReply(ok=True, result=json.loads(wire)["result"])

    @property
    def changes(self) -> list[dict[str, Any]]:
        """The entries of every ``workspace.changes`` the fake runner emitted."""
        return [
            entry
            for _, event in self.events
            if isinstance(event, protocol.WorkspaceChanges)
            for entry in event.entries
        ]


@contextmanager
def relaying_to(fake: FakeWorkspaceRunner) -> Iterator[FakeWorkspaceRunner]:
    with mock.patch("runners.workspace_relay.send_command", fake.send_command):
        yield fake
