"""An MCP server for tests and benchmarks, written with the SDK's own server class.

``python -m testing.mcp_server`` serves over stdio; ``--http`` serves Streamable HTTP
(``--sse``: the legacy SSE transport) on 127.0.0.1 (``--port 0``: a free port) and
prints ``MCP_URL <url>`` once it listens.
Its tools cover what mcp.md asks the runner to handle: text (``echo``), an image
(``image``, with a BMP and a large one on request), an error result (``fail``), a slow call (``slow``), a server that dies
mid-call (``crash``), and a question to the person (``confirm``: ``elicitation/create``
on older protocol versions, an ``input_required`` result on the current one).
``--hang`` never answers ``initialize`` (a server that hangs at start); ``--linger``
stays alive after its stdin closes (so only a parent-death signal stops it).

Part of the project's test doubles: production code never imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import sys
import time
from typing import Annotated

from mcp.server.mcpserver import (
    AcceptedElicitation,
    DeclinedElicitation,
    Elicit,
    ElicitationResult,
    Image,
    MCPServer,
    Resolve,
)
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

# A 1x1 transparent PNG.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


class Confirmation(BaseModel):
    """What ``confirm`` asks for."""

    confirm: bool = Field(description="go ahead?")
    note: str = Field(default="", description="anything to add")


def _ask(question: str) -> Elicit[Confirmation]:
    return Elicit(question, Confirmation)


def build_server(name: str = "testmcp") -> MCPServer:
    server = MCPServer(name, instructions="Tools for the runner's MCP tests.", log_level="WARNING")

    @server.tool(description="Return the text unchanged.")
    def echo(text: str) -> str:
        return text

    @server.tool(
        description="Return a caption and a 1x1 PNG image; optionally also a BMP image and "
        "a PNG of the given size in KiB (a PNG header, then zeros).",
        structured_output=False,
    )
    def image(bmp: bool = False, big_kib: int = 0) -> list[object]:
        result: list[object] = ["a pixel", Image(data=PNG_1X1, format="png")]
        if bmp:
            result.append(Image(data=b"BM" + bytes(64), format="bmp"))
        if big_kib:
            result.append(Image(data=PNG_1X1[:8] + bytes(big_kib * 1024 - 8), format="png"))
        return result

    @server.tool(description="Always fail with the given message.")
    def fail(message: str = "it failed") -> str:
        raise ToolError(message)

    @server.tool(description="Sleep for the given seconds, then answer.")
    async def slow(seconds: float = 1.0) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds:g} s"

    @server.tool(description="Exit the server process at once, mid-call.")
    def crash() -> str:
        os._exit(3)

    @server.tool(description="Ask the person to confirm, then report the answer.")
    async def confirm(
        question: str,
        answer: Annotated[ElicitationResult[Confirmation], Resolve(_ask)],
    ) -> str:
        if isinstance(answer, AcceptedElicitation):
            return f"accepted: confirm={answer.data.confirm} note={answer.data.note}"
        if isinstance(answer, DeclinedElicitation):
            return "declined"
        return "cancelled"

    @server.tool(description="The server's working directory and selected environment.")
    def where(names: list[str] | None = None) -> str:
        shown = {key: os.environ.get(key) for key in names or []}
        return f"cwd={os.getcwd()} env={shown}"

    return server


async def _serve_http(server: MCPServer, port: int, *, sse: bool = False) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # Listening before the URL is printed: a client that connects at once waits in the
    # backlog until uvicorn accepts, instead of being refused.
    sock.listen(128)
    if sse:
        app, path = server.sse_app(host="127.0.0.1"), "/sse"
    else:
        app, path = server.streamable_http_app(host="127.0.0.1"), "/mcp"
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    print(f"MCP_URL http://127.0.0.1:{sock.getsockname()[1]}{path}", flush=True)
    await http.serve(sockets=[sock])


async def _hang() -> None:
    await asyncio.Event().wait()  # reads nothing, answers nothing


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testing.mcp_server")
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP")
    parser.add_argument("--sse", action="store_true", help="serve the legacy SSE transport")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="testmcp")
    parser.add_argument("--hang", action="store_true", help="never answer initialize")
    parser.add_argument("--linger", action="store_true", help="stay alive after stdin closes")
    args = parser.parse_args(argv)
    if args.hang:
        asyncio.run(_hang())
        return
    server = build_server(args.name)
    if args.http or args.sse:
        asyncio.run(_serve_http(server, args.port, sse=args.sse))
    else:
        server.run("stdio")
        if args.linger:
            time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
