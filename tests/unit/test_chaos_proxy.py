"""The chaos proxy of the forced-drop tests (testing/chaos_proxy.py): each kind of drop
does to the two peers what its name says, at the byte it was told."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from testing.chaos_proxy import ChaosProxy
from tests.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(30)

UPGRADE = b"GET /tunnel HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"


class Backend(LoopbackServer):
    """Records what it receives and lets the test send and close."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.ended: list[str] = []
        super().__init__()

    def serve(self, peer: socket.socket) -> None:
        try:
            while data := peer.recv(65536):
                self.received.append(data)
            self.ended.append("eof")
        except ConnectionResetError:
            self.ended.append("reset")
        except OSError:
            self.ended.append("closed")

    def wait_peers(self, count: int) -> socket.socket:
        wait(lambda: len(self.peers) >= count)
        return self.peers[count - 1]


def wait(check: object, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise TimeoutError("condition not reached")


def read_until_end(sock: socket.socket) -> tuple[bytes, str]:
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
        return data, "eof"
    except ConnectionResetError:
        return data, "reset"


@pytest.fixture
def backend() -> Iterator[Backend]:
    server = Backend()
    yield server
    server.close()


@pytest.fixture
def proxy(backend: Backend) -> Iterator[ChaosProxy]:
    chaos = ChaosProxy(backend.port, blackhole_limit_s=3.0).start()
    yield chaos
    chaos.stop()


def tunnel(
    proxy: ChaosProxy, backend: Backend, number: int = 1
) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    client.sendall(UPGRADE)
    peer = backend.wait_peers(number)
    wait(lambda: b"".join(backend.received).endswith(UPGRADE))
    return client, peer


def test_bytes_pass_both_ways_until_a_drop_is_armed(proxy: ChaosProxy, backend: Backend) -> None:
    client, peer = tunnel(proxy, backend)
    peer.sendall(b"101 and welcome")
    assert client.recv(100) == b"101 and welcome"
    client.sendall(b"hello")
    wait(lambda: b"".join(backend.received).endswith(b"hello"))
    assert proxy.drops == [] and proxy.connections == 1


def test_rst_resets_both_peers_after_the_given_bytes(proxy: ChaosProxy, backend: Backend) -> None:
    client, peer = tunnel(proxy, backend)
    proxy.arm("rst", after_bytes=4)
    peer.sendall(b"0123456789")
    data, end = read_until_end(client)
    assert (data, end) == (b"0123", "reset")
    wait(lambda: backend.ended == ["reset"])
    assert [drop.kind for drop in proxy.drops] == ["rst"]


def test_fin_closes_both_peers_cleanly(proxy: ChaosProxy, backend: Backend) -> None:
    client, peer = tunnel(proxy, backend)
    proxy.arm("fin", after_bytes=0)
    assert read_until_end(client) == (b"", "eof")
    wait(lambda: backend.ended == ["eof"])
    assert [drop.kind for drop in proxy.drops] == ["fin"]


def test_black_hole_up_drops_one_direction_until_a_peer_closes(
    proxy: ChaosProxy, backend: Backend
) -> None:
    client, peer = tunnel(proxy, backend)
    proxy.arm("blackhole_up", after_bytes=0)
    wait(lambda: proxy.black_hole_open)
    client.sendall(b"lost")
    peer.sendall(b"still flows")
    assert client.recv(100) == b"still flows"
    time.sleep(0.2)
    assert not b"".join(backend.received).endswith(b"lost")
    peer.shutdown(socket.SHUT_WR)  # the server noticed the silence and closes
    assert read_until_end(client) == (b"", "eof")
    wait(lambda: not proxy.black_hole_open)
    assert proxy.drops[0].kind == "blackhole_up"
    assert proxy.drops[0].noticed_after_s is not None and proxy.unnoticed == []


def test_a_black_hole_nobody_notices_is_recorded(proxy: ChaosProxy, backend: Backend) -> None:
    client, peer = tunnel(proxy, backend)
    proxy.arm("blackhole_down", after_bytes=0)
    peer.sendall(b"never arrives")
    assert read_until_end(client) == (b"", "reset")  # the limit (3 s) passed
    assert [drop.kind for drop in proxy.unnoticed] == ["down"]


def test_resend_cuts_the_next_connection_right_after_its_welcome(
    proxy: ChaosProxy, backend: Backend
) -> None:
    client, peer = tunnel(proxy, backend)
    proxy.arm("resend", after_bytes=3)
    peer.sendall(b"x")
    assert read_until_end(client)[1] == "reset"
    assert proxy.drops == []  # the first half is not the drop
    again, peer2 = tunnel(proxy, backend, number=2)
    peer2.sendall(b"HTTP/1.1 101")
    assert again.recv(100) == b"HTTP/1.1 101"
    time.sleep(0.1)
    peer2.sendall(b"welcome")
    assert again.recv(100) == b"welcome"
    again.sendall(b"resent events")
    assert read_until_end(again)[1] == "reset"
    wait(lambda: b"".join(backend.received).endswith(b"res"))
    assert [drop.kind for drop in proxy.drops] == ["resend"]
    assert proxy.drops[0].connection == 2


def test_other_connections_pass_untouched(proxy: ChaosProxy, backend: Backend) -> None:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    peer = backend.wait_peers(1)
    proxy.arm("rst", after_bytes=0, idle_s=0.2)
    peer.sendall(b"HTTP/1.1 200 OK")
    assert client.recv(100) == b"HTTP/1.1 200 OK"
    time.sleep(0.4)
    assert proxy.drops == [] and proxy.armed and proxy.connections == 0
