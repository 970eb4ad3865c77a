"""A minimal stdio MCP server for benchmarks: one ``echo`` tool, the standard library only.

It speaks the ``initialize`` handshake (protocol 2025-11-25) and answers the current
protocol's ``server/discover`` probe with "method not found", which makes the SDK's
client fall back to the handshake, as it does with any older server. It starts in tens
of milliseconds (``testing/mcp_server.py``, written with the SDK's MCPServer, spends
more than a second of CPU importing the SDK), so ``bench.mcp`` can open and close
sessions of five servers a hundred times and measure the runner, not the SDK's import.
It exits when its stdin closes. Part of the project's test doubles.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TOOL = {
    "name": "echo",
    "description": "Return the text unchanged.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method = request.get("method")
    if "id" not in request:
        return None  # a notification (notifications/initialized, cancelled)
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
    if method == "initialize":
        reply["result"] = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"},
        }
    elif method == "tools/list":
        reply["result"] = {"tools": [TOOL]}
    elif method == "tools/call":
        arguments = (request.get("params") or {}).get("arguments") or {}
        text = str(arguments.get("text", ""))
        reply["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
    return reply


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
