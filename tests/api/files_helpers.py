"""Raw multipart bodies and sample file bytes for the session-file tests.

Django's test client encodes a file part with ``os.path.basename`` of its name, which
would hide the hostile names these tests send, so bodies are built by hand.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

BOUNDARY = "h6-files-boundary-7c1f"
FILES = "/v1/sessions/{session_id}/resources/files"


def multipart(
    parts: list[tuple[str, str | None, bytes]], *, boundary: str = BOUNDARY
) -> tuple[bytes, str]:
    """``(field, filename or None for a plain field, bytes)`` parts → (body, Content-Type)."""
    chunks: list[bytes] = []
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if filename is not None:
            head += "Content-Type: application/octet-stream\r\n"
        chunks.append(head.encode("utf-8", "surrogateescape") + b"\r\n" + data + b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def post_file(client: Any, session_id: str, name: str, data: bytes, *, field: str = "file") -> Any:
    body, content_type = multipart([(field, name, data)])
    return client.generic(
        "POST", FILES.format(session_id=session_id), body, content_type=content_type
    )


def png_bytes(width: int = 2, height: int = 2) -> bytes:
    """A small valid PNG (grey pixels)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


PDF_BYTES = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n"
ZIP_BYTES = b"PK\x03\x04" + b"\x00" * 26 + b"hello"
