"""The embedded deployment's channel layer: Channels' in-memory layer, made to scale
with the number of channels.

The stock ``InMemoryChannelLayer`` sweeps every channel and every group for expired
entries on *every* ``receive``. With one channel per stream subscriber and per
waiting request, a busy session's fan-out then costs O(subscribers²) per event;
profiling the stream benchmark showed a third of the server's time there. Sweeping
at most once a second keeps the same expiry rules (an expired message lives at most
a second longer) at a constant cost per message.
"""

from __future__ import annotations

import time
from typing import Any

from channels.layers import InMemoryChannelLayer


class EmbeddedChannelLayer(InMemoryChannelLayer):
    sweep_interval_s = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_interval_s
        super()._clean_expired()
