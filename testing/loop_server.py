"""A TCP listener on loopback served by an asyncio loop in a thread of its own: the
common part of the test proxies (``chaos_proxy``, ``link_proxy``, ``frame_drop_proxy``),
which a synchronous test starts, controls from its own thread and stops."""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any, Self


class LoopThreadServer(ABC):
    """``start()`` returns once :attr:`port` listens; ``stop()`` closes the listener and
    every connection (``_close_all``) and ends the thread. Subclasses serve ``_accept``."""

    name = "loop server"

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=self.name.replace(" ", "-"), daemon=True
        )
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError(f"the {self.name} did not start")
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop from another thread and wait for it (10 s)."""
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()

    @abstractmethod
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection (on the loop)."""

    @abstractmethod
    async def _close_all(self) -> None:
        """Close the connections the subclass holds (on the loop, at ``stop()``)."""
