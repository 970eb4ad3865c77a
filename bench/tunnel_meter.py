"""A counting TCP proxy for the runner's tunnel, in a process of its own (benchmark only).

``python -m bench.tunnel_meter --target-port P`` listens on a free loopback port, prints
``PORT=<n>`` and pipes every connection to ``127.0.0.1:P`` unchanged. It parses the
WebSocket frames going by (after the HTTP upgrade) and counts, per direction
(``up``: runner → server, ``down``: server → runner), bytes on the wire, messages by
frame type (``event`` frames by the event's own type: ``event:response.output_text.delta``)
and control frames, and apart from them the elements inside ``events`` and ``event.acks``
batches (``batched``, by the same kinds). A line ``report`` on stdin prints the counts as one JSON line.

It runs outside the benchmark process so the clients' load never delays the tunnel,
and it never drops or changes a byte (``testing/chaos_proxy.py`` is the one that does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

CHUNK = 65536
PEEK = 400
TYPE_RE = re.compile(rb'"type"\s*:\s*"([^"]{1,64})"')


class Counter:
    def __init__(self) -> None:
        self.bytes: dict[str, int] = {"up": 0, "down": 0}
        self.messages: dict[str, dict[str, int]] = {"up": {}, "down": {}}
        self.batched: dict[str, dict[str, int]] = {"up": {}, "down": {}}
        self.connections = 0

    def add(self, direction: str, kind: str, table_name: str = "messages") -> None:
        table = getattr(self, table_name)[direction]
        table[kind] = table.get(kind, 0) + 1

    def report(self) -> dict[str, Any]:
        return {
            "bytes": dict(self.bytes),
            "messages": self.messages,
            "batched": self.batched,
            "connections": self.connections,
        }


BATCH_LISTS = {"events": "events", "event.acks": "acks"}


def batch_elements(payload: bytes) -> list[str]:
    """The kinds of the elements of an ``events`` or ``event.acks`` message."""
    try:
        frame = json.loads(payload)
        elements = frame[BATCH_LISTS[frame["type"]]]
        return [message_kind(json.dumps(element).encode(), 1, False) for element in elements]
    except (ValueError, KeyError, TypeError):
        return ["?"]


def unmask(data: bytes, mask: bytes) -> bytes:
    """A client frame's payload, unmasked (one XOR over the whole payload)."""
    key = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")


def message_kind(payload_head: bytes, opcode: int, compressed: bool) -> str:
    if opcode >= 8:
        return {8: "ws:close", 9: "ws:ping", 10: "ws:pong"}.get(opcode, f"ws:op{opcode}")
    if opcode == 0:
        return "ws:continuation"
    if compressed:
        return "compressed"
    types = TYPE_RE.findall(payload_head)
    if not types:
        return "?"
    kind = types[0].decode(errors="replace")
    if kind == "event" and len(types) > 1:
        return "event:" + types[1].decode(errors="replace")
    return kind


class FrameParser:
    """Splits one direction's byte stream into WebSocket frames (after the upgrade)."""

    def __init__(self, counter: Counter, direction: str) -> None:
        self.counter = counter
        self.direction = direction
        self.buffer = bytearray()
        self.upgraded = False

    def feed(self, data: bytes) -> None:
        self.counter.bytes[self.direction] += len(data)
        self.buffer += data
        if not self.upgraded:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            del self.buffer[: end + 4]
            self.upgraded = True
        while self._one_frame():
            pass

    def _one_frame(self) -> bool:
        buf = self.buffer
        if len(buf) < 2:
            return False
        opcode, compressed = buf[0] & 0x0F, bool(buf[0] & 0x40)
        masked, length, pos = bool(buf[1] & 0x80), buf[1] & 0x7F, 2
        if length == 126:
            if len(buf) < 4:
                return False
            length, pos = int.from_bytes(buf[2:4], "big"), 4
        elif length == 127:
            if len(buf) < 10:
                return False
            length, pos = int.from_bytes(buf[2:10], "big"), 10
        mask = b""
        if masked:
            if len(buf) < pos + 4:
                return False
            mask, pos = bytes(buf[pos : pos + 4]), pos + 4
        if len(buf) < pos + length:
            return False
        head = bytes(buf[pos : pos + min(length, PEEK)])
        if masked:
            head = unmask(head, mask)
        kind = message_kind(head, opcode, compressed)
        self.counter.add(self.direction, kind)
        if kind in BATCH_LISTS:
            payload = bytes(buf[pos : pos + length])
            for element in batch_elements(unmask(payload, mask) if masked else payload):
                self.counter.add(self.direction, element, "batched")
        del buf[: pos + length]
        return True


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: FrameParser
) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            parser.feed(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(target_port: int) -> None:
    counter = Counter()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counter.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            pipe(reader, up_writer, FrameParser(counter, "up")),
            pipe(up_reader, writer, FrameParser(counter, "down")),
        )

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT={port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        if line.strip() == b"report":
            print(json.dumps(counter.report()), flush=True)
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.target_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
