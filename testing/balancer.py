"""A small TCP balancer for fail-over tests: each new connection goes to the first
backend that accepts it, and both directions are piped until either side closes.

When a backend process dies, its connections end (the runner sees its tunnel drop)
and the next connection attempt lands on the next backend, as behind a real load
balancer with health-checked backends.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence

CONNECT_TIMEOUT_S = 2.0
CHUNK = 65536


class TcpBalancer:
    def __init__(self, backends: Sequence[tuple[str, int]]) -> None:
        self.backends = list(backends)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.5)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.routed: list[int] = []  # backend index of every connection, in order
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def start(self) -> TcpBalancer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._route, args=(client,), daemon=True).start()

    def _route(self, client: socket.socket) -> None:
        for index, backend in enumerate(self.backends):
            try:
                upstream = socket.create_connection(backend, timeout=CONNECT_TIMEOUT_S)
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self.routed.append(index)
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
            self._pipe(client, upstream)
            return
        _close(client)  # no backend is up: the caller sees the connection close

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                _close(sock)
            with self._lock:
                self._sockets.difference_update((source, target))


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
