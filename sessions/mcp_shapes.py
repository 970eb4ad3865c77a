"""The JSON shapes of a session's MCP servers (mcp.md, "What the server stores and shows").

The runner reports each server's state in ``session.mcp_status``; the latest report is
kept on the session (``Session.mcp_servers``) and shown in the snapshot and in
``GET /v1/sessions/{id}/agent``, next to the declaration the bundle made (never its
header or env values: the stored spec holds none).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from typing_extensions import Doc, TypedDict

from .models import Session

McpStatus = Literal["starting", "ready", "failed", "stopped"]
MCP_STATUSES: tuple[str, ...] = ("starting", "ready", "failed", "stopped")
MCP_TRANSPORTS: tuple[str, ...] = ("stdio", "http", "sse")


class McpServerState(TypedDict):
    """One server's state as the runner last reported it."""

    status: McpStatus
    transport: Annotated[str, Doc("stdio, http (Streamable HTTP) or sse (legacy SSE)")]
    tools: Annotated[list[str], Doc("the namespaced tool names the model is offered")]
    error: NotRequired[Annotated[str, Doc("why it failed or stopped, when it did")]]


class McpServerOut(TypedDict):
    """A declared MCP server with its state (``GET /v1/sessions/{id}/agent``)."""

    name: str
    transport: str
    description: str
    url: Annotated[str | None, Doc("without credentials")]
    command: str | None
    args: list[str]
    status: McpStatus
    tools: list[str]


def clean_states(raw: Any) -> dict[str, McpServerState]:
    """A runner's ``servers`` value with only the known fields of well-formed entries."""
    states: dict[str, McpServerState] = {}
    if not isinstance(raw, dict):
        return states
    for name, entry in list(raw.items())[:64]:
        if not isinstance(name, str) or not isinstance(entry, dict):
            continue
        status = entry.get("status")
        tools = entry.get("tools")
        state: McpServerState = {
            "status": status if status in MCP_STATUSES else "failed",  # type: ignore[typeddict-item]
            "transport": str(entry.get("transport") or ""),
            "tools": [tool for tool in tools if isinstance(tool, str)][:1000]
            if isinstance(tools, list)
            else [],
        }
        error = entry.get("error")
        if isinstance(error, str) and error:
            state["error"] = error[:2000]
        states[name] = state
    return states


def mcp_states(session: Session) -> dict[str, McpServerState]:
    return clean_states(session.mcp_servers)


def mcp_servers_body(session: Session) -> list[McpServerOut]:
    """The agent's declared servers, in declaration order, with their latest state."""
    declared = (session.agent.spec or {}).get("mcp_servers") or []
    states = mcp_states(session)
    servers: list[McpServerOut] = []
    for server in declared:
        if not isinstance(server, dict):
            continue
        state = states.get(str(server.get("name")))
        servers.append(
            {
                "name": str(server.get("name")),
                "transport": str(server.get("transport")),
                "description": str(server.get("description") or ""),
                "url": server.get("url"),
                "command": server.get("command"),
                "args": list(server.get("args") or []),
                "status": state["status"] if state else "stopped",
                "tools": state["tools"] if state else [],
            }
        )
    return servers
