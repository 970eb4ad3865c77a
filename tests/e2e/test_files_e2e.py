"""Session files and fork end to end: real daphne, the real runner, the mock LLM.

- an uploaded text file and a PNG reach the model through both APIs (Responses and
  Chat Completions), in the form each takes (files.md §1);
- a fork bound to a runner answers with the earlier conversation in the model's input
  (files.md §3);
- an oversize upload is cut off at the cap while the server's memory stays flat, with
  a length announced up front, with ``Expect: 100-continue``, and chunked.
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message, wait_turn

from ..api.files_helpers import png_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MiB = 1024 * 1024
TEXT = "Quarterly numbers: 42 apples, 17 pears.\n"


def upload(server: Server, session_id: str, name: str, data: bytes) -> dict[str, Any]:
    with server.client() as client:
        response = client.post(
            f"/v1/sessions/{session_id}/resources/files",
            files={"file": (name, data, "application/octet-stream")},
        )
    assert response.status_code == 201, response.text
    return dict(response.json())


def post_blocks(server: Server, session_id: str, content: list[dict[str, Any]]) -> httpx.Response:
    with server.client() as client:
        return client.post(
            f"/v1/sessions/{session_id}/events",
            json={"type": "message", "data": {"role": "user", "content": content}},
        )


def model_requests(mock_llm: MockLLMServer) -> list[dict[str, Any]]:
    return [r for r in mock_llm.requests if r["path"] in ("/v1/responses", "/v1/chat/completions")]


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_a_text_file_and_a_png_reach_the_model(
    api: str,
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = create_session(server, make_bundle(extra=f"  api: {api}\n"))
    bind(server, session_id, runner.runner_id)
    image = png_bytes(3, 2)
    text_file = upload(server, session_id, "numbers.txt", TEXT.encode())
    png_file = upload(server, session_id, "chart.png", image)
    assert png_file["metadata"]["content_type"] == "image/png"
    # The download is the same bytes.
    with server.client() as client:
        got = client.get(f"/v1/sessions/{session_id}/resources/files/{png_file['id']}/content")
    assert got.content == image and got.headers["x-content-type-options"] == "nosniff"

    mock_llm.configure([{"text": "I see a chart and numbers."}])
    response = post_blocks(
        server,
        session_id,
        [
            {"type": "input_text", "text": "What is in these?"},
            {"type": "input_file", "file_id": text_file["id"]},
            {"type": "input_image", "file_id": png_file["id"]},
        ],
    )
    assert response.status_code == 202, response.text
    turn = wait_turn(server, session_id, response.json()["response_id"])
    assert turn["status"] == "completed", turn
    request = model_requests(mock_llm)[-1]
    received = request["files"]
    png_sha = hashlib.sha256(image).hexdigest()
    text_sha = hashlib.sha256(TEXT.encode()).hexdigest()
    if api == "responses":
        assert request["path"] == "/v1/responses"
        assert {(f["part"], f["filename"], f["media_type"], f["sha256"]) for f in received} == {
            ("input_file", "numbers.txt", "text/plain", text_sha),
            ("input_image", None, "image/png", png_sha),
        }
    else:
        assert request["path"] == "/v1/chat/completions"
        assert [(f["part"], f["media_type"], f["sha256"]) for f in received] == [
            ("image_url", "image/png", png_sha)
        ]
        user = [m for m in request["body"]["messages"] if m["role"] == "user"][-1]
        texts = [part["text"] for part in user["content"] if part["type"] == "text"]
        assert texts[0] == "What is in these?"
        assert texts[1] == f"[file 'numbers.txt']\n{TEXT}"
    # The stored item keeps the file ids, not the bytes.
    with server.client() as client:
        items = client.get(f"/v1/sessions/{session_id}/items").json()["data"]
    user_item = next(item for item in items if item.get("role") == "user")
    assert [part.get("file_id") for part in user_item["content"][1:]] == [
        text_file["id"],
        png_file["id"],
    ]
    assert "file_data" not in str(user_item) and "image_url" not in str(user_item)


def test_a_fork_bound_to_a_runner_continues_the_conversation(
    server: Server,
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    first_runner = launch_runner(server)
    source = create_session(server, make_bundle())
    bind(server, source, first_runner.runner_id)
    notes = upload(server, source, "notes.txt", b"remember the lighthouse")
    mock_llm.configure([{"text": "Noted: your name is Zed."}])
    sent = post_blocks(
        server,
        source,
        [
            {"type": "input_text", "text": "My name is Zed."},
            {"type": "input_file", "file_id": notes["id"]},
        ],
    )
    assert sent.status_code == 202, sent.text
    wait_turn(server, source, sent.json()["response_id"])

    with server.client() as client:
        forked = client.post(f"/v1/sessions/{source}/fork", json={}).json()
    fork_id = forked["id"]
    assert forked["runner_id"] is None
    assert forked["labels"]["omnigent.fork.source_id"] == source
    # A second runner process: it knows nothing of the source, only what session.open says.
    second_runner = launch_runner(server)
    bind(server, fork_id, second_runner.runner_id)
    mock_llm.configure([{"text": "You are Zed."}])
    reply = send_message(server, fork_id, "What is my name?")
    assert reply.status_code == 202, reply.text
    turn = wait_turn(server, fork_id, reply.json()["response_id"])
    assert turn["status"] == "completed", turn
    assert turn["output"][-1]["content"][0]["text"] == "You are Zed."
    body = model_requests(mock_llm)[-1]["body"]
    conversation = [
        (message["role"], part.get("text"))
        for message in body["input"]
        for part in message["content"]
    ]
    assert conversation == [
        ("user", "My name is Zed."),
        (
            "user",
            "[file 'notes.txt' was attached here; its content is not repeated in this history]",
        ),
        ("assistant", "Noted: your name is Zed."),
        ("user", "What is my name?"),
    ]


# --- oversize uploads: cut off at the cap, memory flat -----------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def read_status(sock: socket.socket, deadline: float) -> bytes:
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def push_oversize(
    server: Server,
    session_id: str,
    *,
    total: int,
    chunked: bool,
    expect: bool = False,
    path: str | None = None,
) -> tuple[bytes, int, int]:
    """Send a ``total``-byte multipart body.

    Returns the server's answer, how many body bytes had been sent when it was first
    readable (``total`` if only after the whole body), and the server's peak RSS (KiB).
    """
    host, port = server.url.removeprefix("http://").split(":")
    pid = server.process.popen.pid
    boundary = "oversize-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
    ).encode()
    headers = [
        f"POST {path or f'/v1/sessions/{session_id}/resources/files'} HTTP/1.1",
        f"Host: {host}:{port}",
        "X-Forwarded-Email: alice@example.com",
        f"Content-Type: multipart/form-data; boundary={boundary}",
    ]
    headers.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    if expect:
        headers.append("Expect: 100-continue")
    sock = socket.create_connection((host, int(port)), timeout=30)
    peak = rss_kib(pid)
    sent = 0
    answered_after = total
    answer = b""
    block = b"a" * MiB
    deadline = time.monotonic() + 60
    try:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        if expect:
            return read_status(sock, deadline), 0, max(peak, rss_kib(pid))
        payload = head
        while sent < total and time.monotonic() < deadline:
            piece = (payload + block)[: min(MiB, total - sent)]
            payload = b""
            frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            if sent % (16 * MiB) < MiB:
                peak = max(peak, rss_kib(pid))
            if not answer:
                # Has the server answered already (while the body is still coming)?
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    with contextlib.suppress(OSError):
                        answer = sock.recv(65536)
                    answered_after = sent
        if not answer:
            try:
                answer = read_status(sock, deadline)
            except (ConnectionResetError, TimeoutError):
                answer = b""
    finally:
        peak = max(peak, rss_kib(pid))
        sock.close()
    return answer, answered_after, peak


@pytest.mark.timeout(240)
def test_an_oversize_upload_is_cut_off_with_flat_memory(
    launch_server: Callable[..., Server], make_bundle: Callable[..., bytes]
) -> None:
    server = launch_server(OMNIGENT_MAX_UPLOAD_BYTES=str(MiB))
    session_id = create_session(server, make_bundle())
    pid = server.process.popen.pid
    # Warm up the request path so the baseline includes what a first upload loads.
    upload(server, session_id, "small.txt", b"warm up")
    baseline = rss_kib(pid)

    answer, answered_after, peak = push_oversize(server, session_id, total=200 * MiB, chunked=False)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # Refused from the headers: the answer was there long before the body was sent.
    assert answered_after < 100 * MiB, answered_after
    assert b'"payload_too_large"' in answer
    answer, _sent, _ = push_oversize(
        server, session_id, total=200 * MiB, chunked=False, expect=True
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"100 Continue" not in answer
    answer, answered_after, chunked_peak = push_oversize(
        server, session_id, total=200 * MiB, chunked=True
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # Counted while it came: refused around the cap, not after the 200 MiB.
    assert answered_after < 100 * MiB, answered_after
    # The rest of each body was read and dropped (for at most 2 s), never stored.
    peak = max(peak, chunked_peak)
    growth_mib = (peak - baseline) / 1024
    assert growth_mib < 24, f"server RSS grew by {growth_mib:.1f} MiB"
    # Nothing was kept: no file row, no stored or temporary bytes beyond the warm-up file.
    data_dir = Path(server.env["OMNIGENT_DATA_DIR"]) / "files"
    assert len([p for p in data_dir.rglob("*") if p.is_file()]) == 1
    with server.client() as client:
        listed = client.get(f"/v1/sessions/{session_id}/resources/files").json()["data"]
    assert [f["name"] for f in listed] == ["small.txt"]
    # A file just under the cap still goes through the same path.
    assert upload(server, session_id, "fits.txt", b"b" * (MiB - 10))["metadata"]["bytes"] == (
        MiB - 10
    )


def test_a_body_over_djangos_caps_is_refused_at_the_socket_on_any_path(
    server: Server, make_bundle: Callable[..., bytes]
) -> None:
    """A bundle upload (or any API body) past what Django would take is refused from its
    headers, not stored whole first (omnigent_site/runtime/body_limit.py, default)."""
    session_id = create_session(server, make_bundle())
    for path in ("/v1/sessions", "/v1/agents", f"/v1/sessions/{session_id}/events"):
        answer, answered_after, _ = push_oversize(
            server, session_id, total=200 * MiB, chunked=False, path=path
        )
        assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])
        assert answered_after < 100 * MiB, (path, answered_after)
    # A body within the caps still reaches the view (here: a bundle it refuses as such).
    with server.client() as client:
        assert client.post("/v1/sessions", json={"title": "no agent"}).status_code == 400


def chunked_multipart(name: str, data: bytes, *, piece: int = 64 * 1024) -> Iterator[bytes]:
    """A one-part multipart body as a generator: httpx sends it chunked, with no length."""
    yield (
        f'--{CHUNKED_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{name}"\r\nContent-Type: text/plain\r\n\r\n'
    ).encode()
    for start in range(0, len(data), piece):
        yield data[start : start + piece]
    yield f"\r\n--{CHUNKED_BOUNDARY}--\r\n".encode()


CHUNKED_BOUNDARY = "chunked-upload"


def test_a_chunked_upload_is_taken_up_to_the_cap_and_413_past_it(
    launch_server: Callable[..., Server], make_bundle: Callable[..., bytes]
) -> None:
    """No ``Content-Length``, ``Transfer-Encoding: chunked``: the same rules as a body with
    a length (files.md §1), through the real daphne."""
    server = launch_server(OMNIGENT_MAX_UPLOAD_BYTES=str(MiB))
    session_id = create_session(server, make_bundle())
    path = f"/v1/sessions/{session_id}/resources/files"
    headers = {"Content-Type": f"multipart/form-data; boundary={CHUNKED_BOUNDARY}"}
    fits = b"c" * (MiB - 10)
    with server.client() as client:
        request = client.build_request(
            "POST", path, headers=headers, content=chunked_multipart("fits.txt", fits)
        )
        assert request.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in request.headers
        created = client.send(request)
        assert created.status_code == 201, created.text
        assert created.json()["metadata"]["bytes"] == len(fits)
        stored = client.get(f"{path}/{created.json()['id']}/content")
        assert stored.content == fits
        # Past the cap but within the socket's slack for the framing: the upload handler's 413.
        over = client.post(
            path, headers=headers, content=chunked_multipart("over.txt", b"d" * (MiB + 1))
        )
        assert over.status_code == 413, over.text
        assert over.json()["error"]["code"] == "payload_too_large"
        # A chunked JSON body is read too.
        renamed = client.patch(
            f"/v1/sessions/{session_id}",
            headers={"Content-Type": "application/json"},
            content=iter([b'{"title": ', b'"chunked"}']),
        )
        assert renamed.status_code == 200, renamed.text
        assert renamed.json()["title"] == "chunked"
        listed = client.get(path).json()["data"]
    assert [f["name"] for f in listed] == ["fits.txt"]
