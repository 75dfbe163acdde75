"""The webhook dispatcher: sends the deliveries events left (app.store.events), signed
(app.upstream.signing), retried with backoff, and disables a webhook that keeps
failing.

It runs beside the compaction workers, in every process that runs them (``serve``
with workers, ``compactd worker``). Deliveries are claimed like jobs (``FOR UPDATE
SKIP LOCKED``, leased by moving their next attempt past the request's timeout), so
processes share the work and a dispatcher that dies leaves its deliveries to be
claimed again. A delivery is at least once: a receiver drops repeats by its
``webhook-id``.

An attempt succeeds on a 2xx. Anything else (another status, a timeout, a refused
connection) is retried after a capped exponential backoff with full jitter, up to
``webhook_max_attempts``; then the delivery is ``failed``. Every failed attempt counts
against its webhook, every success resets the count: at
``webhook_disable_after_failures`` in a row the webhook is disabled, its pending
deliveries skipped, and a ``webhook.disabled`` event written.

It also deletes events and finished deliveries older than
``events_retention_seconds``, once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection, unavailable_cause
from app.core.outbound import Lane
from app.core.settings import Settings
from app.store import events, webhooks
from app.upstream import signing
from app.upstream.client import backoff_delay

log = logging.getLogger("compactd.webhooks")

# Deliveries in flight at once (the webhook lane's connections: app.core.outbound).
BATCH = 32
EXPIRE_EVERY_SECONDS = 60.0
# A delivery claimed while its tenant had as many in flight as it may is put back,
# due again this much later (its claim not counted as an attempt).
POSTPONE_SECONDS = 0.5


class Dispatcher:
    """The delivery loop of a worker process (see the module's docstring).

    Deliveries are sent by the webhook lane (app.core.outbound), at most its
    per-tenant share of them at once for one tenant: receivers of one tenant that
    hang hold only that tenant's places, and the loop claims more as soon as any
    delivery is done, not when a whole batch is (one hanging delivery held up all the
    others of its batch)."""

    channel = events.CHANNEL

    def __init__(self, engine: AsyncEngine, lane: Lane, settings: Settings) -> None:
        self.engine = engine
        self.lane = lane
        self.settings = settings
        self.wake = asyncio.Event()
        self.poll_seconds = settings.compaction_poll_seconds
        self._expired_at = 0.0
        self._flying: set[asyncio.Task[None]] = set()
        self._tenants: dict[str, int] = defaultdict(int)  # deliveries in flight per tenant

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    while not stop.is_set() and await self.run_once(wait=False):
                        pass
                    await self._expire()
                except Exception as exc:  # the database went away, a bug: keep going later
                    if unavailable_cause(exc) is not None:
                        log.warning("webhooks: the database is unavailable")
                    else:
                        log.exception("webhooks: a pass failed")
                await _wait(stop, self.wake, self.poll_seconds)
        finally:
            flying = set(self._flying)
            if flying:  # each ends within its timeout
                try:
                    await asyncio.wait(flying)
                except asyncio.CancelledError:  # past the grace period: their lease is left
                    for task in flying:
                        task.cancel()
                    await asyncio.gather(*flying, return_exceptions=True)
                    raise

    async def run_once(self, *, wait: bool = True) -> int:
        """Claim the deliveries due now that this dispatcher has room for, and send
        them (``wait``: until they are done, else in the background); how many were
        claimed and sent."""
        room = BATCH - sum(self._tenants.values())
        if room <= 0:
            return 0
        per_tenant = self.lane.per_tenant
        busy = [t for t, n in self._tenants.items() if n >= per_tenant]
        lease = self.settings.webhook_timeout_seconds * 2 + 5
        async with driver_connection(self.engine) as driver, driver.transaction():
            claimed = await webhooks.claim(driver, room, lease, busy)
        groups: dict[str, list[webhooks.Claimed]] = defaultdict(list)
        later: list[webhooks.DeliveryRow] = []
        for c in claimed:
            tenant = c.delivery.tenant_id
            if self._tenants[tenant] + len(groups[tenant]) >= per_tenant:
                later.append(c.delivery)
            else:
                groups[tenant].append(c)
        for tenant in [t for t, n in self._tenants.items() if n == 0]:
            del self._tenants[tenant]
        if later:
            async with driver_connection(self.engine) as driver:
                await webhooks.postponed(driver, later, POSTPONE_SECONDS)
            self._later(POSTPONE_SECONDS)
        started = []
        for tenant, group in groups.items():
            if not group:
                continue
            self._tenants[tenant] += len(group)
            task = asyncio.ensure_future(self._send_group(tenant, group))
            self._flying.add(task)
            task.add_done_callback(self._flying.discard)
            started.append(task)
        if wait and started:
            await asyncio.gather(*started)
        return len(claimed) - len(later)

    async def _send_group(self, tenant: str, group: list[webhooks.Claimed]) -> None:
        """One tenant's deliveries of a claim; their successes recorded together."""
        try:
            answered = await asyncio.gather(*(self._send(c) for c in group))
            done = [a for a in answered if a is not None]
            if done:
                async with driver_connection(self.engine) as driver, driver.transaction():
                    await webhooks.all_succeeded(driver, done)
        except Exception as exc:
            if unavailable_cause(exc) is not None:
                log.warning("webhooks: the database is unavailable")
            else:
                log.exception("webhooks: a delivery failed")
        finally:
            self._tenants[tenant] -= len(group)
            self.wake.set()  # room for more

    async def _send(self, claimed: webhooks.Claimed) -> tuple[webhooks.DeliveryRow, int] | None:
        """Send one delivery. A success comes back, recorded with the pass's others; a
        failure is recorded here (it may disable the webhook)."""
        delivery = claimed.delivery
        if claimed.url is None or not claimed.enabled:
            why = "the webhook was deleted" if claimed.url is None else "the webhook is disabled"
            async with driver_connection(self.engine) as driver:
                await webhooks.skipped(driver, delivery, why)
            return None
        body = orjson.dumps(delivery.payload)
        # The place is taken before the delivery's own timeout starts (app.core.outbound).
        async with self.lane.slot(delivery.tenant_id) as http:
            sent = await signing.post(
                http,
                claimed.url,
                claimed.secret,
                delivery.event_id,
                body,
                self.settings.webhook_timeout_seconds,
            )
        if sent.ok and sent.status is not None:
            return delivery, sent.status
        settings = self.settings
        async with driver_connection(self.engine) as driver, driver.transaction():
            error = (
                sent.error
                or f"answered {sent.status}: {sent.body[:200].decode('utf-8', 'replace')}"
            )
            last = delivery.attempts >= settings.webhook_max_attempts
            delay = backoff_delay(
                delivery.attempts,
                base=settings.webhook_backoff_base_seconds,
                cap=settings.webhook_backoff_cap_seconds,
                retry_after=None,
                rand=random.random,
            )
            await webhooks.delivered(
                driver,
                delivery,
                status="failed" if last else "pending",
                http_status=sent.status,
                error=error,
                retry_in_seconds=0.0 if last else delay,
            )
            disabled = await webhooks.failed(
                driver,
                delivery.tenant_id,
                delivery.webhook_id,
                settings.webhook_disable_after_failures,
            )
        if disabled:
            log.warning(
                "webhook disabled after %d failed attempts in a row",
                settings.webhook_disable_after_failures,
                extra={"tenant": delivery.tenant_id, "webhook_id": str(delivery.webhook_id)},
            )
        elif not last:
            # Woken for it when it is due soon (a short backoff); polled otherwise.
            self._later(delay)
        return None

    def _later(self, delay: float) -> None:
        if delay <= self.poll_seconds:
            asyncio.get_running_loop().call_later(max(delay, 0.0), self.wake.set)

    async def _expire(self) -> None:
        now = time.monotonic()
        if now - self._expired_at < EXPIRE_EVERY_SECONDS:
            return
        self._expired_at = now
        retention = self.settings.events_retention_seconds
        async with driver_connection(self.engine) as driver:
            while await events.expire(driver, retention) == 1000:
                pass
            while await webhooks.expire(driver, retention) == 1000:
                pass


async def _wait(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
