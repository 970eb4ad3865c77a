"""A minimal stdio MCP server for benchmarks and tests, the standard library only:
``echo``, ``slow`` (sleeps ``seconds``), ``leave`` (answers, then exits while idle) and
``crash`` (exits mid-call); ``--hang`` reads its stdin and never answers (a server that
hangs at start).

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
import os
import sys
import threading
from typing import Any

TOOLS = [
    {
        "name": "echo",
        "description": "Return the text unchanged.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "slow",
        "description": "Sleep for the given seconds, then answer.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {
        "name": "leave",
        "description": "Answer, then exit (code 4) after the given seconds, while idle.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {
        "name": "crash",
        "description": "Exit the server process at once, mid-call.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


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
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call":
        params = request.get("params") or {}
        arguments = params.get("arguments") or {}
        if params.get("name") == "crash":
            os._exit(3)
        if params.get("name") == "leave":
            threading.Timer(float(arguments.get("seconds", 0.2)), leave).start()
            reply["result"] = {"content": [{"type": "text", "text": "leaving"}], "isError": False}
            return reply
        if params.get("name") == "slow":
            # Answered later from a timer, so calls behind it are not held up.
            reply["result"] = {"content": [{"type": "text", "text": "slept"}], "isError": False}
            threading.Timer(float(arguments.get("seconds", 1)), send, [reply]).start()
            return None
        text = str(arguments.get("text", ""))
        reply["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
    return reply


_WRITE = threading.Lock()


def leave() -> None:
    sys.stderr.write("tiny server: leaving on request\n")
    sys.stderr.flush()
    os._exit(4)


def send(reply: dict[str, Any]) -> None:
    with _WRITE:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    hang = "--hang" in sys.argv[1:]
    for line in sys.stdin:
        if hang:
            continue
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            send(reply)
    os._exit(0)  # stdin closed: leave without waiting for a slow call's timer


if __name__ == "__main__":
    main()
