"""Sending webhook deliveries (automation.md, Delivered at least once).

Every server process runs ``deliver_forever`` (registered with ``on_serve``), or with
``OMNIGENT_WEBHOOK_DELIVERY=worker`` only the processes of ``manage.py deliverwebhooks``
do (``deliver_as_worker``), so the server processes spend no CPU on sending. Each
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
import ssl
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import aiohttp
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from omnigent_site import metrics
from omnigent_site.rawsql import insert_values, update_rows
from omnigent_site.users import is_admin
from webhook_outbox.models import WebhookEvent

from . import fanout, ssrf, wakeup
from .models import Delivery, DeliveryAttempt, Webhook
from .shapes import event_body
from .signing import signed_headers

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "omnigent-webhooks/1"
# Connections kept per receiving host name (the worker sends at most
# ``OMNIGENT_WEBHOOK_CONCURRENCY`` attempts at once).
CONNECTIONS_PER_HOST = 32
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
    due = Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now)
    # A plain read first: an idle process takes no write lock (SQLite has one).
    if not due.exists():
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
        lost_ids = {row.pk for row in lost}
        taken = [row for row in rows if row.pk not in lost_ids]
        until = now + claim_lease()
        Delivery.objects.filter(pk__in=[row.pk for row in taken]).update(
            attempts=F("attempts") + 1, claimed_until=until, next_attempt_at=until
        )
    # An event goes to several webhooks: its body is serialised once.
    bodies: dict[str, str] = {}
    for row in taken:
        if row.event_id not in bodies:
            bodies[row.event_id] = json.dumps(
                event_body(row.event), separators=(",", ":"), ensure_ascii=False
            )
    return [
        Claimed(
            delivery_id=row.pk,
            attempt=row.attempts + 1,
            webhook_id=row.webhook_id,
            url=row.webhook.url,
            event_id=row.event_id,
            body=bodies[row.event_id],
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
    session per host name, so a TLS connection made for one name never carries
    another's; its connections are kept alive for the next attempts.

    aiohttp, not httpx: posting to a loopback receiver 32 at a time, httpx (with
    httpcore's pool and anyio) spent about 2.3 ms of CPU per request, aiohttp about
    0.25 ms (docs/performance-history.md)."""

    def __init__(self, *, max_clients: int = 64, verify: ssl.SSLContext | bool = True) -> None:
        self._clients: OrderedDict[str, aiohttp.ClientSession] = OrderedDict()
        self._max_clients = max_clients
        # The certificate authorities to trust (the system's; tests pass their own).
        self._ssl: ssl.SSLContext | bool = verify

    def _client(self, host: str) -> aiohttp.ClientSession:
        client = self._clients.pop(host, None)
        if client is None:
            client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=CONNECTIONS_PER_HOST,
                    limit_per_host=CONNECTIONS_PER_HOST,
                    use_dns_cache=False,
                ),
                trust_env=False,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s()),
            )
            while len(self._clients) >= self._max_clients:
                _, oldest = self._clients.popitem(last=False)
                asyncio.get_running_loop().create_task(oldest.close())
        self._clients[host] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()

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
                async with client.post(
                    target.connect_url,
                    data=claimed.body.encode(),
                    headers=headers,
                    allow_redirects=False,
                    ssl=self._ssl if target.scheme == "https" else False,
                    server_hostname=target.host if target.scheme == "https" else None,
                ) as response:
                    # Read up to the cap; a body left unread closes the connection.
                    read = 0
                    while read < MAX_RESPONSE_BYTES:
                        chunk = await response.content.read(MAX_RESPONSE_BYTES - read)
                        if not chunk:
                            break
                        read += len(chunk)
                    code = response.status
        except ssrf.UnsafeURL as exc:
            return outcome(None, exc.public_message)
        except TimeoutError:
            return outcome(None, f"timed out after {timeout_s():g} s")
        except aiohttp.ClientError as exc:
            return outcome(None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        except OSError as exc:
            return outcome(None, f"{type(exc).__name__}: {exc}")
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
    """``record_outcomes`` for one attempt."""
    return record_outcomes([(claimed, outcome)], now=now, rng=rng)[0]


def record_outcomes(
    batch: Sequence[tuple[Claimed, Outcome]], *, now: datetime, rng: random.Random
) -> list[Delivery | None]:
    """Store the results of attempts and decide what comes next for each, in one
    transaction. Nothing is stored for a delivery that is gone or that another attempt
    claimed since (its claim expired): its entry is None."""
    if not batch:
        return []
    with transaction.atomic():
        rows = {
            row.pk: row
            for row in Delivery.objects.select_for_update(of=("self",))
            .select_related("webhook")
            .filter(pk__in=[claimed.delivery_id for claimed, _ in batch])
        }
        results: list[Delivery | None] = []
        attempts: list[tuple[object, ...]] = []
        changed: list[Delivery] = []
        # Per webhook: whether a delivery succeeded in this batch, and the failed events
        # counted after the last success.
        reset: set[str] = set()
        failed_events: Counter[str] = Counter()
        gone: set[str] = set()
        stamp = timezone.now()
        for claimed, outcome in batch:
            row = rows.get(claimed.delivery_id)
            # Gone, claimed again since, or this attempt's outcome already stored.
            stale = row is None or row.attempts != claimed.attempt or row.claimed_until is None
            if row is None or stale or row in changed:
                results.append(None)
                continue
            attempts.append(
                (
                    row.pk,
                    claimed.attempt,
                    outcome.started_at,
                    outcome.status_code,
                    outcome.error,
                    outcome.latency_ms,
                )
            )
            row.last_status_code = outcome.status_code
            row.last_error = outcome.error
            row.latency_ms = outcome.latency_ms
            row.claimed_until = None
            row.updated_at = stamp
            if outcome.delivered:
                row.status = Delivery.Status.DELIVERED
                row.next_attempt_at = None
                reset.add(row.webhook_id)
                failed_events.pop(row.webhook_id, None)
            elif outcome.status_code == 410:
                row.status = Delivery.Status.FAILED
                row.next_attempt_at = None
                gone.add(row.webhook_id)
            else:
                delays = retry_delays()
                if delays and row.attempts < len(delays) + 1 + row.extra_attempts:
                    delay = delays[min(row.attempts, len(delays)) - 1]
                    row.next_attempt_at = now + jittered(delay, rng)
                else:
                    row.status = Delivery.Status.FAILED
                    row.next_attempt_at = None
                    failed_events[row.webhook_id] += 1
            changed.append(row)
            results.append(row)
        insert_values(DeliveryAttempt, ATTEMPT_COLUMNS, attempts, ignore_conflicts=True)
        update_rows(changed, _RESULT_FIELDS)
        to_reset = [
            pk
            for pk in reset - set(failed_events)
            if any(r.webhook_id == pk and r.webhook.consecutive_failures for r in changed)
        ]
        if to_reset:
            Webhook.objects.filter(pk__in=to_reset).update(consecutive_failures=0)
        for webhook_id, count in failed_events.items():
            _count_failed_events(webhook_id, count, after_success=webhook_id in reset)
        for webhook_id in gone:
            _disable(webhook_id, "the receiver answered 410 Gone")
        # omnigent_webhook_deliveries_total: each stored attempt, by what became of it.
        counted = [
            "delivered"
            if row.status == Delivery.Status.DELIVERED
            else "gave_up"
            if row.status == Delivery.Status.FAILED
            else "retrying"
            for row in changed
        ]
        transaction.on_commit(lambda: _count_deliveries(counted))
    return results


# An attempt's log row (``rawsql.insert_values``: no model instances to build).
ATTEMPT_COLUMNS = ("delivery", "number", "started_at", "status_code", "error", "latency_ms")
# The fields an attempt's result changes (``rawsql.update_rows``: not ``bulk_update``,
# whose CASE WHEN per field and row cost more CPU than the attempts' HTTP requests).
_RESULT_FIELDS = (
    "status",
    "last_status_code",
    "last_error",
    "latency_ms",
    "claimed_until",
    "next_attempt_at",
    "updated_at",
)


def _count_deliveries(outcomes: list[str]) -> None:
    for outcome in outcomes:
        metrics.webhook_delivered(status=outcome)


def _count_failed_events(webhook_id: str, count: int, *, after_success: bool) -> None:
    failures = F("consecutive_failures") + count if not after_success else count
    Webhook.objects.filter(pk=webhook_id).update(consecutive_failures=failures)
    total = (
        Webhook.objects.filter(pk=webhook_id).values_list("consecutive_failures", flat=True).first()
    )
    limit = int(settings.OMNIGENT_WEBHOOK_DISABLE_AFTER)
    if total is not None and limit > 0 and total >= limit:
        _disable(webhook_id, f"{total} events in a row failed to deliver")


# --- retention --------------------------------------------------------------------------

PRUNE_EVERY_S = 3600.0


def prune(*, now: datetime) -> int:
    """Delete deliveries finished longer than ``OMNIGENT_WEBHOOK_RETENTION_DAYS`` ago
    (with their attempts), then the events left without a delivery; returns the rows
    deleted with the deliveries. Pending deliveries are kept, however old."""
    cutoff = now - timedelta(days=float(settings.OMNIGENT_WEBHOOK_RETENTION_DAYS))
    deleted, _ = (
        Delivery.objects.filter(updated_at__lt=cutoff)
        .exclude(status=Delivery.Status.PENDING)
        .delete()
    )
    WebhookEvent.objects.filter(
        dispatched=True, created_at__lt=cutoff, deliveries__isnull=True
    ).delete()
    return int(deleted)


# --- the worker -------------------------------------------------------------------------


# How long the outcome of a finished attempt may wait to be recorded with others.
RECORD_AFTER_S = 0.1
# How long a committed event may wait for the round that sends it, with the others
# committed meanwhile (automation.md: p50 < 1 s from the fact to the receiver).
WAKE_AFTER_S = 0.05


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
        # Outcomes of finished attempts, recorded together at the start of a round.
        self.finished: list[tuple[Claimed, Outcome]] = []
        self.woken = asyncio.Event()
        self._record_timer: asyncio.TimerHandle | None = None
        self._wake_timer: asyncio.TimerHandle | None = None

    async def record(self) -> None:
        batch, self.finished = self.finished, []
        if batch:
            await database_sync_to_async(record_outcomes)(batch, now=self.clock(), rng=self.rng)

    def _round(self, batch: list[tuple[Claimed, Outcome]], room: int) -> tuple[int, list[Claimed]]:
        """A round's database work in one trip to a database thread (each hop costs the
        event loop a thread hand-off): record, fan out, claim, each its own transaction."""
        if batch:
            record_outcomes(batch, now=self.clock(), rng=self.rng)
        taken = fanout.fan_out(now=self.clock())
        return taken, claim_due(now=self.clock(), limit=room)

    async def step(self) -> bool:
        """One round; True when there may be more to do at once."""
        batch, self.finished = self.finished, []
        # Attempts ending meanwhile only free more room: the next round takes it.
        room = self.concurrency - len(self.in_flight)
        taken, claimed = await database_sync_to_async(self._round)(batch, room)
        for one in claimed:
            task = asyncio.get_running_loop().create_task(self._attempt(one))
            self.in_flight.add(task)
            task.add_done_callback(self._done)
        return taken >= fanout.FAN_OUT_BATCH or (room > 0 and len(claimed) == room)

    def _done(self, task: asyncio.Task[None]) -> None:
        """An attempt ended: a round records its outcome (and fills the freed slot)
        ``RECORD_AFTER_S`` later, with the outcomes of every attempt ending meanwhile,
        rather than one round (one write transaction) per attempt. The receiver already
        has the event; only the deliveries list waits."""
        self.in_flight.discard(task)
        if self._record_timer is None:
            self._record_timer = asyncio.get_running_loop().call_later(
                RECORD_AFTER_S, self._record_due
            )

    def _record_due(self) -> None:
        self._record_timer = None
        self.woken.set()

    def wake_soon(self) -> None:
        """An event was committed: a round starts ``WAKE_AFTER_S`` later, for it and for
        the events committed meanwhile (the turns of a busy server end many at a time;
        a round per event cost more in building its queries than the rows it moved)."""
        if self._wake_timer is None:
            self._wake_timer = asyncio.get_running_loop().call_later(WAKE_AFTER_S, self._wake_due)

    def _wake_due(self) -> None:
        self._wake_timer = None
        self.woken.set()

    async def _attempt(self, claimed: Claimed) -> None:
        try:
            outcome = await self.sender.send(claimed, now=self.clock())
        except Exception:
            # The claim expires and the attempt is retried.
            log.exception("could not deliver %s", claimed.delivery_id)
            return
        self.finished.append((claimed, outcome))

    async def drain(self, *, deadline_s: float) -> None:
        """Wait for the attempts in flight and record their outcomes."""
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=deadline_s)
        for timer in (self._record_timer, self._wake_timer):
            if timer is not None:
                timer.cancel()
        self._record_timer = self._wake_timer = None
        await self.record()

    async def run(self, *, poll_s: float) -> None:
        pruned_at = time.monotonic()
        while True:
            self.woken.clear()
            if time.monotonic() - pruned_at >= PRUNE_EVERY_S:
                pruned_at = time.monotonic()
                try:
                    await database_sync_to_async(prune)(now=self.clock())
                except Exception:
                    log.exception("could not prune old webhook deliveries")
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
_relay: wakeup.Relay | None = None
_loop: asyncio.AbstractEventLoop | None = None


def wake() -> None:
    """Called after a commit that wrote an event (any thread): start a round soon
    (``Worker.wake_soon``), or with ``OMNIGENT_WEBHOOK_DELIVERY=worker`` wake the
    worker processes soon (``wakeup.Relay``)."""
    target, loop = _relay or _worker, _loop
    if target is not None and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(target.wake_soon)


async def deliver_forever() -> None:
    """The process-wide loop (``on_serve``): rounds on every wake-up and every
    ``OMNIGENT_WEBHOOK_POLL_S``, until cancelled. With ``OMNIGENT_WEBHOOK_DELIVERY=worker``
    the server process sends nothing and relays its wake-ups to the processes running
    ``manage.py deliverwebhooks`` (``deliver_as_worker``)."""
    if settings.OMNIGENT_WEBHOOK_DELIVERY == "worker":
        await relay_wakeups(wakeup.Relay(get_channel_layer(), after_s=WAKE_AFTER_S))
        return
    await serve(Worker(), poll_s=float(settings.OMNIGENT_WEBHOOK_POLL_S))


async def relay_wakeups(relay: wakeup.Relay) -> None:
    """Run ``relay`` as this process's (the one ``wake`` reaches)."""
    global _relay, _loop
    _relay, _loop = relay, asyncio.get_running_loop()
    try:
        await relay.run()
    finally:
        if _relay is relay:
            _relay = None


async def deliver_as_worker(worker: Worker, *, poll_s: float) -> None:
    """A delivery worker process (``manage.py deliverwebhooks``): ``worker`` delivers,
    woken by every server process through the channel layer and by its own poll (by
    the poll alone with the embedded layer, which reaches no other process)."""
    layer = get_channel_layer()
    if not wakeup.reaches_other_processes(layer):
        log.info("the channel layer is embedded: finding events every %g s", poll_s)
        await serve(worker, poll_s=poll_s)
        return
    listening = asyncio.get_running_loop().create_task(wakeup.listen(layer, worker.wake_soon))
    try:
        await serve(worker, poll_s=poll_s)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


async def serve(worker: Worker, *, poll_s: float) -> None:
    """Run ``worker`` as this process's worker (the one ``wake`` reaches)."""
    global _worker, _loop
    _worker, _loop = worker, asyncio.get_running_loop()
    try:
        await worker.run(poll_s=poll_s)
    finally:
        await worker.drain(deadline_s=1.0)
        await worker.sender.aclose()
        if _worker is worker:
            _worker = None
