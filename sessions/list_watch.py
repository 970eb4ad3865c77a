"""Whether any session list is open (``GET /v1/sessions/updates``), so that list rows are
not read and rendered for nobody.

A list-row announcement (``updates.py``) reads the session's row with its grantees after
the commit and renders it for each of them, twice a turn. With no list open anywhere,
that was about a tenth of a turn's server CPU spent on group messages that no stream
receives (``docs/performance-history.md``, item 29); API clients, the compatible ones included,
follow a session through its snapshot or its stream, not through the list.

Every open list stream marks one key, ``LISTS_OPEN_KEY``, in the ``presence`` cache
(this process's memory, or Redis when ``REDIS_URL`` is set, shared by every process):
before it joins its group, and again at least every heartbeat interval while it runs.
The mark lives ``mark_ttl_s()``, four heartbeat intervals. A writer reads the key after
its commit and announces nothing when it is absent.

- **No gap.** A list marks the key before it joins its group, and its client reloads
  the list only after the stream's first frame. A writer that found no mark committed
  before the mark was made, so before that reload, which therefore shows the write;
  one that found the mark announces as before.
- **The mark outlives the last list** by up to its lifetime: rows go on being announced
  to nobody for that long, which is harmless.
- **A cache that fails counts as a list open**: the announcements go on, as before
  this module. A stream that cannot mark the key logs it and is served all the same.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import caches

log = logging.getLogger(__name__)

LISTS_OPEN_KEY = "lists-open"


def mark_ttl_s() -> float:
    """How long one mark lasts: four of the heartbeats the list stream refreshes it at."""
    return 4 * float(settings.OMNIGENT_STREAM_HEARTBEAT_S)


def lists_open() -> bool:
    """Whether a session list may be open in any server process (sync: a writer's thread)."""
    try:
        return caches["presence"].get(LISTS_OPEN_KEY) is not None
    except Exception:  # noqa: BLE001 - e.g. Redis unreachable: announce as if one were open
        log.warning("presence cache unavailable; announcing list rows", exc_info=True)
        return True


async def mark_list_open() -> None:
    """Called by an open list stream: before it joins its group, then every heartbeat."""
    try:
        await caches["presence"].aset(LISTS_OPEN_KEY, True, mark_ttl_s())
    except Exception:  # noqa: BLE001 - writers that cannot read the mark announce anyway
        log.warning("presence cache unavailable; could not mark a list open", exc_info=True)
