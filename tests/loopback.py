"""A TCP server on loopback for the proxy tests: each accepted connection is served on
a thread of its own by the subclass's ``serve``."""

from __future__ import annotations

import socket
import threading


class LoopbackServer:
    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.peers: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                peer, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            self.peers.append(peer)
            threading.Thread(target=self.serve, args=(peer,), daemon=True).start()

    def serve(self, peer: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()
        for peer in self.peers:
            peer.close()
