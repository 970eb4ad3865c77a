"""The link proxy of the accident tests (testing/link_proxy.py): bytes pass in order,
a partition holds them until it heals, a cut resets the connections and refuses new
ones until restored, and ``stop()`` ends its thread."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from testing.link_proxy import LinkProxy
from tests.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(30)


class Echo(LoopbackServer):
    """Sends back every byte it receives."""

    def serve(self, peer: socket.socket) -> None:
        with peer, contextlib.suppress(ConnectionError):  # a cut resets it
            while data := peer.recv(65536):
                peer.sendall(data)


@pytest.fixture
def proxy() -> Iterator[LinkProxy]:
    echo = Echo()
    link = LinkProxy(echo.port).start()
    try:
        yield link
    finally:
        link.stop()
        echo.listener.close()


def connect(link: LinkProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", link.port), timeout=5)


def read_exactly(client: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_bytes_pass_in_order_and_a_partition_holds_them_until_it_heals(proxy: LinkProxy) -> None:
    with connect(proxy) as client:
        client.sendall(b"one")
        assert read_exactly(client, 3) == b"one"
        proxy.partition()
        client.sendall(b"two")
        client.settimeout(0.3)
        with pytest.raises(TimeoutError):
            client.recv(3)  # held: nothing arrives while partitioned
        client.settimeout(5)
        proxy.heal()
        assert read_exactly(client, 3) == b"two"
    assert proxy.connections == 1


def closed_by_peer(client: socket.socket) -> bool:
    """Whether the other end closed or reset the connection (no data came instead)."""
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_cut_resets_the_connection_and_refuses_new_ones_until_restored(
    proxy: LinkProxy,
) -> None:
    client = connect(proxy)
    client.sendall(b"x")
    assert read_exactly(client, 1) == b"x"
    proxy.cut()
    assert closed_by_peer(client)
    client.close()
    with connect(proxy) as refused:
        assert closed_by_peer(refused)  # accepted by the listener, then reset at once
    proxy.restore()
    with connect(proxy) as client:
        client.sendall(b"back")
        assert read_exactly(client, 4) == b"back"
    assert proxy.connections == 2


def test_stop_ends_the_thread() -> None:
    echo = Echo()
    link = LinkProxy(echo.port).start()
    assert link.url == f"http://127.0.0.1:{link.port}"
    link.stop()
    assert not link._thread.is_alive()
    echo.listener.close()
