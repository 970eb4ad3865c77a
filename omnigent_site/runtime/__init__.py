"""Every change this project makes to the behaviour of the libraries it runs on.

The server runs on daphne (Twisted), Django's ASGI handler and middleware, and
Channels' layers. Where their stock behaviour was too slow or unsafe for this
server, the change lives here and nowhere else, so an upgrade has one place to
re-check. Each change has a guard test (``tests/unit/test_runtime_guards.py``, and
``tests/unit/test_scale_out_layer.py`` for the Redis layer) that asserts the
library internals it relies on are still there and still behave: an upgrade
breaks a test, not production.

- ``handler``: Django's ASGI handler with each request's sync thread taken from a
  pool of idle threads (``asgiref``'s ``ThreadSensitiveContext(executor=...)``),
  and handed back once a response streams.
- ``middleware``: Django's standard middleware with its hooks run on the event
  loop instead of one thread hop each.
- ``flow``: reaches Twisted's request through daphne's ``send`` to learn when an
  SSE client stops reading (a push producer).
- ``shutdown``: open streams end with ``data: [DONE]`` when the server stops (a
  Twisted before-shutdown trigger; requests get a moment to finish).
- ``server``: what daphne and Twisted do differently in this project: the tunnel's
  WebSocket frame limit, no form parsing of POST bodies by Twisted, startup
  objects frozen out of the garbage collector's full passes, and background
  tasks (``on_serve``) started with the reactor. ``server_application`` applies
  all of it when ``omnigent_site/asgi.py`` builds the application, so a bare
  ``daphne omnigent_site.asgi:application`` behaves exactly like
  ``python -m omnigent_site.serve``.
- ``body_limit``: ``limit_request_body``, where apps register paths whose request
  bodies are refused with 413 while they arrive, before Twisted stores them.
- ``background``: ``on_serve``, where apps register process-wide loops (the
  runners app's stale-runner sweep) without ``omnigent_site`` importing them, and
  ``on_start``/``on_stop``, what a process does once as it starts serving and as it
  begins a clean stop (the runners app's tunnel liveness).
- ``channel_layer``: the embedded (in-memory) and scale-out (Redis) channel layers,
  with one receive prefix per process, cheaper sweeps and no orphaned buffers.
- ``redis_cache``: one Redis connection pool per process for Django's Redis caches
  (the throttles' counts, the session-list mark), through the backend's documented
  ``pool_class`` option; Django makes a cache object per request, and with the stock
  pool each one opened a connection of its own; and ``RedisCacheWithRates``, Django's
  Redis cache with ``admit``, the throttles' check in one atomic Lua script. Its guard
  (``tests/unit/test_redis_cache.py``) counts the connections Redis holds.
- ``event_loop``: the loop daphne runs on, uvloop, chosen by ``omnigent_site.serve``
  through asyncio's public event-loop policy before daphne is imported (daphne makes
  its loop on import, so this one thing cannot wait for the application; a bare
  ``daphne`` command keeps asyncio's loop). It changes no library's behaviour, only
  the loop's implementation, and needs no guard: ``tests/e2e/test_bare_daphne.py``
  runs real servers both ways.
- ``sqlite3``: Django's SQLite backend (the ``ENGINE`` on SQLite) with write
  transactions queued on a lock in the process instead of sleeping in SQLite's busy
  handler, handed over in order, first to a thread inside
  ``write_priority.writing_ahead`` (guards: ``tests/unit/test_sqlite_write_lock.py``).

Apps never import these internals except through the small surface below and
``flow``/``shutdown`` (the stream uses them).
"""

from __future__ import annotations

from omnigent_site.runtime.background import on_serve, on_start, on_stop
from omnigent_site.runtime.body_limit import limit_request_body

__all__ = ["limit_request_body", "on_serve", "on_start", "on_stop"]
