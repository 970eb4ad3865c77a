"""Sending webhook deliveries (automation.md, Delivered at least once).

Every server process runs ``deliver_forever`` (registered with ``on_serve``). Each
round it fans new outbox events out (``fanout``) and claims due deliveries:
``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two processes never take the
same row; on SQLite the write transaction serialises them (one worker). A claim counts
the attempt and moves ``next_attempt_at`` to the claim's expiry, then commits, so the
HTTP request runs outside any transaction; a process killed mid-delivery leaves the row
due again once the claim expires, and another process retries it. An outcome is
recorded only by the attempt that claimed it (``attempts`` unchanged).

2xx is delivered; anything else, a timeout or a refused connection is retried after
``OMNIGENT_WEBHOOK_RETRY_S`` (5 s, 30 s, 2 min, 10 min, 1 h, 6 h, 24 h, each ± 10 %),
then ``failed``. 410 Gone disables the webhook; so do 20 failed events in a row.
Whether the owner may still read the session is checked at each claim: a revoked grant
stops the deliveries (``failed``, not sent). The clock and the jitter are injectable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from omnigent_site.users import is_admin

from . import fanout, ssrf
from .models import Delivery, DeliveryAttempt, Webhook
from .shapes import event_body
from .signing import signed_headers

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "omnigent-webhooks/1"
NO_ACCESS = "the webhook's owner can no longer read this session"


def retry_delays() -> list[float]:
    return [float(delay) for delay in settings.OMNIGENT_WEBHOOK_RETRY_S]


def timeout_s() -> float:
    return float(settings.OMNIGENT_WEBHOOK_TIMEOUT_S)


def claim_lease() -> timedelta:
    """How long a claimed attempt may take before another process may retry it: the
    request's timeout, the name resolution's and a margin."""
    return timedelta(seconds=3 * timeout_s() + 5)


def jittered(delay: float, rng: random.Random) -> timedelta:
    return timedelta(seconds=delay * (1 + rng.uniform(-0.1, 0.1)))


# --- claiming ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """One attempt this process took: everything the request needs, read at claim time."""

    delivery_id: str
    attempt: int
    webhook_id: str
    url: str
    event_id: str
    body: str
    secrets: tuple[str, ...]


def _secrets_in_force(webhook: Webhook, now: datetime) -> tuple[str, ...]:
    expires = webhook.previous_secret_expires_at
    if webhook.previous_secret and expires is not None and expires > now:
        return (webhook.secret, webhook.previous_secret)
    return (webhook.secret,)


def claim_due(*, now: datetime, limit: int) -> list[Claimed]:
    """Take up to ``limit`` due deliveries of enabled webhooks: each becomes one attempt
    of this process. Deliveries whose owner lost access end ``failed`` unsent."""
    if limit <= 0:
        return []
    with transaction.atomic():
        rows = list(
            Delivery.objects.filter(
                status=Delivery.Status.PENDING, next_attempt_at__lte=now, webhook__enabled=True
            )
            .order_by("next_attempt_at", "id")
            .select_related("event", "webhook", "webhook__owner")
            .select_for_update(skip_locked=True, of=("self",))[:limit]
        )
        if not rows:
            return []
        readers = fanout.session_readers(
            row.event.session_id for row in rows if row.event.audience is None
        )
        lost = [
            row
            for row in rows
            if not fanout.may_receive(
                row.webhook, row.event, readers=readers, admin=is_admin(row.webhook.owner)
            )
        ]
        if lost:
            Delivery.objects.filter(pk__in=[row.pk for row in lost]).update(
                status=Delivery.Status.FAILED,
                last_error=NO_ACCESS,
                next_attempt_at=None,
                claimed_until=None,
            )
        taken = [row for row in rows if row not in lost]
        until = now + claim_lease()
        Delivery.objects.filter(pk__in=[row.pk for row in taken]).update(
            attempts=F("attempts") + 1, claimed_until=until, next_attempt_at=until
        )
    return [
        Claimed(
            delivery_id=row.pk,
            attempt=row.attempts + 1,
            webhook_id=row.webhook_id,
            url=row.webhook.url,
            event_id=row.event_id,
            body=json.dumps(event_body(row.event), separators=(",", ":"), ensure_ascii=False),
            secrets=_secrets_in_force(row.webhook, now),
        )
        for row in taken
    ]


# --- sending ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str
    latency_ms: int
    started_at: datetime

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Sender:
    """HTTP for the attempts: no redirects, no proxies from the environment, a
    timeout, the response read up to 64 KiB, and a connection to the checked address
    (the host name goes in ``Host`` and in TLS's SNI and certificate check). One client
    per host name, so a TLS connection made for one name never carries another's."""

    def __init__(self, *, max_clients: int = 64) -> None:
        self._clients: OrderedDict[str, httpx.AsyncClient] = OrderedDict()
        self._max_clients = max_clients

    def _client(self, host: str) -> httpx.AsyncClient:
        client = self._clients.pop(host, None)
        if client is None:
            client = httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,
                timeout=httpx.Timeout(timeout_s()),
                limits=httpx.Limits(max_connections=32, max_keepalive_connections=8),
            )
            while len(self._clients) >= self._max_clients:
                _, oldest = self._clients.popitem(last=False)
                asyncio.get_running_loop().create_task(oldest.aclose())
        self._clients[host] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.aclose()

    async def send(self, claimed: Claimed, *, now: datetime) -> Outcome:
        started = time.monotonic()

        def outcome(status_code: int | None, error: str) -> Outcome:
            latency = int((time.monotonic() - started) * 1000)
            return Outcome(status_code, error[:500], latency, now)

        try:
            async with asyncio.timeout(timeout_s()):
                target = await asyncio.to_thread(ssrf.check_url, claimed.url)
                headers = {
                    **signed_headers(
                        secrets_in_force=claimed.secrets,
                        event_id=claimed.event_id,
                        timestamp=now,
                        body=claimed.body,
                    ),
                    "content-type": "application/json",
                    "user-agent": USER_AGENT,
                    "host": target.host_header,
                }
                client = self._client(target.host)
                request = client.build_request(
                    "POST",
                    target.connect_url,
                    content=claimed.body.encode(),
                    headers=headers,
                    extensions={"sni_hostname": target.host},
                )
                response = await client.send(request, stream=True)
                try:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read >= MAX_RESPONSE_BYTES:
                            break
                finally:
                    await response.aclose()
        except ssrf.UnsafeURL as exc:
            return outcome(None, exc.public_message)
        except TimeoutError:
            return outcome(None, f"timed out after {timeout_s():g} s")
        except httpx.TimeoutException:
            return outcome(None, f"timed out after {timeout_s():g} s")
        except httpx.HTTPError as exc:
            return outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        except OSError as exc:
            return outcome(None, f"{type(exc).__name__}: {exc}")
        code = response.status_code
        error = "" if 200 <= code < 300 else f"the receiver answered {code}"
        return outcome(code, error)


# --- recording --------------------------------------------------------------------------


def _disable(webhook_id: str, reason: str) -> None:
    Webhook.objects.filter(pk=webhook_id).update(
        enabled=False, disabled_reason=reason, updated_at=timezone.now()
    )
    log.warning("webhook %s disabled: %s", webhook_id, reason)


def record_outcome(
    *, claimed: Claimed, outcome: Outcome, now: datetime, rng: random.Random
) -> Delivery | None:
    """Store an attempt's result and decide what comes next. Nothing is stored when
    the delivery is gone or another attempt claimed it since (its claim expired)."""
    with transaction.atomic():
        row = (
            Delivery.objects.select_for_update()
            .filter(pk=claimed.delivery_id, attempts=claimed.attempt)
            .first()
        )
        if row is None:
            return None
        try:
            with transaction.atomic():
                DeliveryAttempt.objects.create(
                    delivery=row,
                    number=claimed.attempt,
                    started_at=outcome.started_at,
                    status_code=outcome.status_code,
                    error=outcome.error,
                    latency_ms=outcome.latency_ms,
                )
        except IntegrityError:
            return None
        row.last_status_code = outcome.status_code
        row.last_error = outcome.error
        row.latency_ms = outcome.latency_ms
        row.claimed_until = None
        if outcome.delivered:
            row.status = Delivery.Status.DELIVERED
            row.next_attempt_at = None
            Webhook.objects.filter(pk=row.webhook_id, consecutive_failures__gt=0).update(
                consecutive_failures=0
            )
        elif outcome.status_code == 410:
            row.status = Delivery.Status.FAILED
            row.next_attempt_at = None
            _disable(row.webhook_id, "the receiver answered 410 Gone")
        else:
            delays = retry_delays()
            if delays and row.attempts < len(delays) + 1 + row.extra_attempts:
                delay = delays[min(row.attempts, len(delays)) - 1]
                row.next_attempt_at = now + jittered(delay, rng)
            else:
                row.status = Delivery.Status.FAILED
                row.next_attempt_at = None
                _count_failed_event(row.webhook_id)
        row.save(
            update_fields=[
                "status",
                "last_status_code",
                "last_error",
                "latency_ms",
                "claimed_until",
                "next_attempt_at",
                "updated_at",
            ]
        )
    return row


def _count_failed_event(webhook_id: str) -> None:
    Webhook.objects.filter(pk=webhook_id).update(consecutive_failures=F("consecutive_failures") + 1)
    failures = (
        Webhook.objects.filter(pk=webhook_id).values_list("consecutive_failures", flat=True).first()
    )
    limit = int(settings.OMNIGENT_WEBHOOK_DISABLE_AFTER)
    if failures is not None and limit > 0 and failures >= limit:
        _disable(webhook_id, f"{failures} events in a row failed to deliver")


# --- the worker -------------------------------------------------------------------------


class Worker:
    """One process's deliveries: fans out, claims what it has room for, sends each
    attempt as its own task (a slow receiver holds one slot, not the round)."""

    def __init__(
        self,
        *,
        clock: Clock = timezone.now,
        rng: random.Random | None = None,
        concurrency: int | None = None,
        sender: Sender | None = None,
    ) -> None:
        self.clock = clock
        self.rng = rng or random.Random()
        self.concurrency = concurrency or int(settings.OMNIGENT_WEBHOOK_CONCURRENCY)
        self.sender = sender or Sender()
        self.in_flight: set[asyncio.Task[None]] = set()
        self.woken = asyncio.Event()

    async def step(self) -> bool:
        """One round; True when there may be more to do at once."""
        taken = await database_sync_to_async(fanout.fan_out)(now=self.clock())
        room = self.concurrency - len(self.in_flight)
        claimed = await database_sync_to_async(claim_due)(now=self.clock(), limit=room)
        for one in claimed:
            task = asyncio.get_running_loop().create_task(self._attempt(one))
            self.in_flight.add(task)
            task.add_done_callback(self._done)
        return taken >= fanout.FAN_OUT_BATCH or (room > 0 and len(claimed) == room)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self.woken.set()

    async def _attempt(self, claimed: Claimed) -> None:
        try:
            outcome = await self.sender.send(claimed, now=self.clock())
            await database_sync_to_async(record_outcome)(
                claimed=claimed, outcome=outcome, now=self.clock(), rng=self.rng
            )
        except Exception:
            # The claim expires and the attempt is retried.
            log.exception("could not deliver %s", claimed.delivery_id)

    async def drain(self, *, deadline_s: float) -> None:
        """Wait for the attempts in flight (tests and the benchmark)."""
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=deadline_s)

    async def run(self, *, poll_s: float) -> None:
        while True:
            self.woken.clear()
            try:
                more = await self.step()
            except Exception:
                log.exception("webhook delivery round failed")
                more = False
            if more:
                await asyncio.sleep(0)
                continue
            try:
                await asyncio.wait_for(self.woken.wait(), timeout=poll_s)
            except TimeoutError:
                pass


_worker: Worker | None = None
_loop: asyncio.AbstractEventLoop | None = None


def wake() -> None:
    """Called after a commit that wrote an event (any thread): start a round now."""
    worker, loop = _worker, _loop
    if worker is not None and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(worker.woken.set)


async def deliver_forever() -> None:
    """The process-wide loop (``on_serve``): rounds on every wake-up and every
    ``OMNIGENT_WEBHOOK_POLL_S``, until cancelled."""
    global _worker, _loop
    _worker, _loop = Worker(), asyncio.get_running_loop()
    try:
        await _worker.run(poll_s=float(settings.OMNIGENT_WEBHOOK_POLL_S))
    finally:
        await _worker.sender.aclose()
        _worker = None
