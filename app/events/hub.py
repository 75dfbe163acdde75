"""The streams' wake-up: one ``LISTEN`` connection per process on the events channel
(app.store.events), waking the streams of the tenant an event was written for.
Streams read the log themselves; a wake-up only says there may be more, and they
poll as the fallback (a lost connection, an event whose transaction was not yet
below every running one's when it was notified)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import asyncpg

from app.core.database import DriverBounds
from app.store import events

log = logging.getLogger("compactd.events")


class Waiter:
    """One stream's wake-up."""

    def __init__(self, hub: EventHub, tenant: str, session_id: str | None) -> None:
        self.hub = hub
        self.tenant = tenant
        self.session_id = session_id  # None: the tenant's stream
        self.event = asyncio.Event()

    async def wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), seconds)
        self.event.clear()

    def close(self) -> None:
        self.hub.leave(self)


class EventHub:
    def __init__(self, dsn: str, bounds: DriverBounds | None = None) -> None:
        self.dsn = dsn
        self.bounds: DriverBounds = bounds or {}
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._reads: dict[Hashable, asyncio.Future[list[events.Event]]] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closing = False

    async def read(
        self, key: Hashable, fetch: Callable[[], Awaitable[list[events.Event]]]
    ) -> list[events.Event]:
        """``fetch()``'s answer, shared with every stream that asks with the same ``key``
        while it is in flight (a read at the same place: the same answer). A stream that
        leaves meanwhile does not cancel it for the others."""
        running = self._reads.get(key)
        if running is None:
            running = asyncio.ensure_future(fetch())
            self._reads[key] = running
            running.add_done_callback(lambda done: self._done_reading(key, done))
        return await asyncio.shield(running)

    def _done_reading(self, key: Hashable, done: asyncio.Future[list[events.Event]]) -> None:
        self._reads.pop(key, None)
        if not done.cancelled():
            done.exception()  # seen: the streams that awaited it raised it, if any did

    @property
    def streams(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def tenant_streams(self, tenant: str) -> int:
        return len(self._waiters.get(tenant, ()))

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen())

    def end_streams(self) -> None:
        """Wake every stream so that it ends (the server is stopping); no new one opens."""
        self.closing = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()

    async def close(self) -> None:
        """Stop listening, and end every stream."""
        self.end_streams()
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def join(self, tenant: str, session_id: str | None = None) -> Waiter:
        waiter = Waiter(self, tenant, session_id)
        self._waiters[tenant].add(waiter)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter.tenant)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter.tenant]

    def _wake(self, tenant: str | None, session_id: str | None = None) -> None:
        """Wake the streams ``tenant``'s event may concern (all, with no tenant): its
        tenant's stream, and its session's (every session's, with no session)."""
        groups = self._waiters.values() if tenant is None else [self._waiters.get(tenant, set())]
        for waiters in groups:
            for waiter in waiters:
                if session_id is None or waiter.session_id in (None, session_id):
                    waiter.event.set()

    def _notified(self, _connection: Any, _pid: int, _channel: str, payload: object) -> None:
        # "<tenant>\t<session>" (app.store.events), or "<tenant>" alone.
        tenant, tab, session_id = str(payload).partition("\t")
        self._wake(tenant, session_id if tab else None)

    async def _listen(self) -> None:
        while not self._stop.is_set():
            connection: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                connection = await asyncpg.connect(self.dsn, **self.bounds)
                lost = asyncio.Event()
                connection.add_termination_listener(_setter(lost))
                await connection.add_listener(events.CHANNEL, self._notified)
                self._wake(None)  # events may have come while not listening
                stop = asyncio.ensure_future(self._stop.wait())
                gone = asyncio.ensure_future(lost.wait())
                try:
                    await asyncio.wait([stop, gone], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    gone.cancel()
            except Exception as exc:  # polled meanwhile; never stop listening
                log.warning("event hub: %r; streams poll until it reconnects", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 2.0)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close(timeout=2)


def _setter(event: asyncio.Event) -> Any:
    def set_it(*_: Any) -> None:
        event.set()

    return set_it
