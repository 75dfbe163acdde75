"""The limits a request meets once its API key is checked (:mod:`app.keys.auth` runs
first, so a request without a valid key never counts here), shared fairly by tenants:

1. **Admission.** At most ``max_concurrent + max_queued`` requests are in the process
   (body arriving, waiting for a slot, or running), and at most ``tenant_concurrent +
   tenant_queued`` of one tenant; beyond either, 503 at once.
2. **The body** is read whole, up to ``max_body_bytes`` (else 413, and the connection
   closes), *before* a slot is taken: a slow upload holds its own place in the queue,
   never a slot. Bodies held in memory are bounded too, at most
   ``max_buffered_body_bytes`` in all and ``tenant_buffered_body_bytes`` of one tenant
   (else 503), so that one tenant's large uploads leave room for the others' requests.
3. **A slot.** At most ``max_concurrent`` handlers run at once, and at most
   ``tenant_concurrent`` of one tenant, so another tenant always finds a slot or gets the
   next one freed. A freed slot goes to the waiting tenant with the fewest running, and
   among those to the request that has waited longest.

One deadline of ``timeout`` seconds from the request's arrival covers the body (still
arriving then: 408, and the connection closes) and the wait for a slot (503).

A handler is never cancelled halfway: that would abandon a transaction mid-way and could
answer 503 for a write that commits. Its database work is bounded by the pool's checkout
timeout, Postgres's ``statement_timeout`` and the driver's command timeout instead (see
:mod:`app.core.database`).

Requests outside ``/v1`` (the docs, the spec, unknown paths) need no key, so anyone can
send them: they share one tenant of their own here, :data:`NO_TENANT`, with a small share
of its own (none of their routes reads a body): a body of at most :data:`KEYLESS_BODY_BYTES`
and at most :data:`KEYLESS_PLACES` requests in the process. Ops probes skip the limits
altogether.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import deque
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core import metrics
from app.core.errors import (
    BadRequest,
    PayloadTooLarge,
    ProblemError,
    RequestTimeout,
    ServiceUnavailable,
)
from app.core.http import problem_response
from app.core.observability import OPS_PATHS
from app.core.settings import Settings

log = logging.getLogger("compactd.http")

# The tenant of requests that need no API key (outside /v1).
NO_TENANT = ""
# What NO_TENANT may hold: anyone can send these requests, and none of their routes reads
# a body, so a few small ones are plenty (the docs and the spec are GETs).
KEYLESS_BODY_BYTES = 64 * 1024
KEYLESS_PLACES = 16


@dataclass(frozen=True)
class Limits:
    max_concurrent: int
    max_queued: int
    tenant_concurrent: int
    tenant_queued: int
    max_body_bytes: int
    max_buffered_body_bytes: int
    tenant_buffered_body_bytes: int
    timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        """The tenant shares default to half of the server's, rounded up."""

        def share(tenant: int | None, total: int) -> int:
            return tenant if tenant is not None else -(-total // 2)

        return cls(
            max_concurrent=settings.max_concurrent_requests,
            max_queued=settings.max_queued_requests,
            tenant_concurrent=share(
                settings.max_tenant_concurrent_requests, settings.max_concurrent_requests
            ),
            tenant_queued=share(settings.max_tenant_queued_requests, settings.max_queued_requests),
            max_body_bytes=settings.max_body_bytes,
            max_buffered_body_bytes=settings.max_buffered_body_bytes,
            tenant_buffered_body_bytes=share(
                settings.max_tenant_buffered_body_bytes, settings.max_buffered_body_bytes
            ),
            timeout=settings.request_timeout_seconds,
        )

    def body_limit(self, tenant: str) -> int:
        """The largest body a request of ``tenant`` may send."""
        if tenant == NO_TENANT:
            return min(self.max_body_bytes, KEYLESS_BODY_BYTES)
        return self.max_body_bytes

    def places(self, tenant: str) -> int:
        """How many requests of ``tenant`` may be in the process at once."""
        places = self.tenant_concurrent + self.tenant_queued
        if tenant == NO_TENANT:
            return min(places, KEYLESS_PLACES)
        return places


# ------------------------------------------------------------------------ slots


@dataclass(eq=False)
class _Tenant:
    name: str
    admitted: int = 0  # in the process: body arriving, waiting for a slot, or running
    running: int = 0
    buffered: int = 0  # bytes of its requests' bodies held in memory
    # Oldest first: (arrival number, the future a granted slot resolves).
    waiters: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)


class FairSlots:
    """Admission, body memory and slots, by tenant (see the module's docstring). Not
    thread-safe: one event loop's requests."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._free = limits.max_concurrent
        self._admitted = 0
        # Bytes of request bodies held in memory (arriving, waiting or being handled):
        # bodies are read before a slot, so the queue alone would let them add up to
        # (slots + queue) x max_body_bytes.
        self.buffered = 0
        self._arrivals = 0
        # Only tenants with a request in the process.
        self._tenants: dict[str, _Tenant] = {}

    def admit(self, tenant: str) -> str | None:
        """Count a request in, or say why not: ``queue_full``, ``tenant_queue_full`` or
        (for requests that need no key) ``keyless_queue_full``."""
        limits = self.limits
        if self._admitted >= limits.max_concurrent + limits.max_queued:
            return "queue_full"
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(tenant)
        elif state.admitted >= limits.places(tenant):
            return "keyless_queue_full" if tenant == NO_TENANT else "tenant_queue_full"
        state.admitted += 1
        self._admitted += 1
        return None

    def fits(self, tenant: str, size: int) -> str | None:
        """Whether ``size`` more bytes of an admitted request's body may be held, or why
        not: ``bodies_full`` (the process's total) or ``tenant_bodies_full`` (its
        tenant's share)."""
        if self.buffered + size > self.limits.max_buffered_body_bytes:
            return "bodies_full"
        if self._tenants[tenant].buffered + size > self.limits.tenant_buffered_body_bytes:
            return "tenant_bodies_full"
        return None

    def hold(self, tenant: str, size: int) -> str | None:
        """Count ``size`` bytes of an admitted request's body as held, or say why not
        (see :meth:`fits`); give them back with :meth:`drop`."""
        refused = self.fits(tenant, size)
        if refused is None:
            self.buffered += size
            self._tenants[tenant].buffered += size
        return refused

    def drop(self, tenant: str, size: int) -> None:
        self.buffered -= size
        self._tenants[tenant].buffered -= size

    def buffered_by(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.buffered if state else 0

    def leave(self, tenant: str) -> None:
        """The admitted request is done (whether or not it ever held a slot)."""
        state = self._tenants[tenant]
        state.admitted -= 1
        self._admitted -= 1
        if state.admitted == 0:
            del self._tenants[tenant]

    def in_process(self, tenant: str | None = None) -> int:
        """Requests admitted, of one tenant or of all."""
        if tenant is None:
            return self._admitted
        state = self._tenants.get(tenant)
        return state.admitted if state else 0

    def take(self, tenant: str) -> bool:
        """Take a slot when one is free to ``tenant`` now (no one waits before it)."""
        state = self._tenants[tenant]
        if self._free and not state.waiters and state.running < self.limits.tenant_concurrent:
            self._take(state)
            return True
        return False

    async def acquire(self, tenant: str) -> None:
        """Wait for a slot (bound the wait from outside, e.g. with ``asyncio.timeout``)."""
        if self.take(tenant):
            return
        state = self._tenants[tenant]
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._arrivals += 1
        entry = (self._arrivals, waiter)
        state.waiters.append(entry)
        self._dispatch()  # a slot is free and behind a waiter that gave up: take it now
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(tenant)  # granted just as the wait was given up: pass it on
            else:
                with contextlib.suppress(ValueError):
                    state.waiters.remove(entry)
            raise

    def release(self, tenant: str) -> None:
        state = self._tenants[tenant]
        state.running -= 1
        self._free += 1
        self._dispatch()

    def _take(self, state: _Tenant) -> None:
        state.running += 1
        self._free -= 1

    def _dispatch(self) -> None:
        cap = self.limits.tenant_concurrent
        while self._free:
            chosen: _Tenant | None = None
            for state in self._tenants.values():
                while state.waiters and state.waiters[0][1].done():
                    state.waiters.popleft()  # given up; its owner is removing it too
                if not state.waiters or state.running >= cap:
                    continue
                if chosen is None or (state.running, state.waiters[0][0]) < (
                    chosen.running,
                    chosen.waiters[0][0],
                ):
                    chosen = state
            if chosen is None:
                return
            self._take(chosen)
            chosen.waiters.popleft()[1].set_result(None)


# -------------------------------------------------------------------- middleware


class _BodyTooLarge(Exception):
    pass


class _BodiesFull(Exception):
    """The process, or the request's tenant, already holds its limit of request bodies."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_EVENT_STREAM = re.compile(r"^/v1/(?:sessions/[^/]+/)?events$")


def _event_stream(scope: Scope) -> bool:
    return scope.get("method") == "GET" and _EVENT_STREAM.match(scope["path"]) is not None


class LimitMiddleware:
    """Admission, the body, then a fair slot (see the module's docstring). Plain ASGI:
    no task of its own, and the body is handed to the app as the one message it was
    read into."""

    def __init__(self, app: ASGIApp, *, limits: Limits) -> None:
        self.app = app
        self.limits = limits
        self.slots = FairSlots(limits)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPS_PATHS or _event_stream(scope):
            # An event stream (no body) holds no slot for its hours: its route caps
            # how many are open (app.events.router).
            await self.app(scope, receive, send)
            return
        tenant: str = scope.get("state", {}).get("tenant") or NO_TENANT
        refused = self.slots.admit(tenant)
        if refused is not None:
            await self._refuse_admission(scope, receive, send, refused, tenant)
            return
        held = [0]  # bytes of this request's body counted as held (see FairSlots.hold)
        try:
            await self._serve(scope, receive, send, tenant, held)
        finally:
            self.slots.drop(tenant, held[0])
            self.slots.leave(tenant)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, tenant: str, held: list[int]
    ) -> None:
        limits = self.limits
        deadline = asyncio.get_running_loop().time() + limits.timeout
        body_limit = limits.body_limit(tenant)
        declared = _declared_length(scope)
        if declared > body_limit:
            await _answer(self._too_large(tenant), scope, receive, send)
            return
        if declared and (full := self.slots.fits(tenant, declared)):
            await self._refuse_bodies(scope, receive, send, full, tenant)
            return

        # The fast paths cost nothing when they apply (most requests on a server that is
        # not saturated): a request with no body (no Content-Length, not chunked) has
        # nothing to read, and a free slot is taken without a wait; neither then shows in
        # the receiving or waiting gauges, which it would leave in the same instant.
        app_receive = receive
        if declared or _chunked(scope):
            metrics.HTTP_RECEIVING.inc()
            try:
                async with asyncio.timeout_at(deadline):
                    body = await self._read_body(receive, tenant, body_limit, held)
            except TimeoutError:
                metrics.HTTP_REJECTED.labels("body_timeout").inc()
                log.warning("request body timed out", extra={"path": scope["path"]})
                late = RequestTimeout(
                    f"the request body did not arrive within {limits.timeout:g} s",
                    headers={"Connection": "close"},
                )
                await _answer(late, scope, receive, send)
                return
            except _BodyTooLarge:
                await _answer(self._too_large(tenant), scope, receive, send)
                return
            except _BodiesFull as full:
                await self._refuse_bodies(scope, receive, send, full.reason, tenant)
                return
            finally:
                metrics.HTTP_RECEIVING.dec()
            if body is None:  # the client left; nobody reads this answer, the log does
                gone = BadRequest("the connection closed before the request body arrived")
                await _answer(gone, scope, receive, send)
                return
            app_receive = _replay(body, receive)

        if not self.slots.take(tenant):
            metrics.HTTP_WAITING.inc()
            try:
                async with asyncio.timeout_at(deadline):
                    await self.slots.acquire(tenant)
            except TimeoutError:
                await _refuse(
                    scope,
                    receive,
                    send,
                    "timeout",
                    f"no free slot within {limits.timeout:g} s (the server is busy); retry shortly",
                )
                return
            finally:
                metrics.HTTP_WAITING.dec()

        metrics.HTTP_IN_FLIGHT.inc()
        try:
            await self.app(scope, app_receive, send)
        finally:
            self.slots.release(tenant)
            metrics.HTTP_IN_FLIGHT.dec()

    def _too_large(self, tenant: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body is over the {self.limits.body_limit(tenant)}-byte limit"
            + (" of requests that need no API key" if tenant == NO_TENANT else ""),
            # Else uvicorn would go on reading (and dropping) the rest of the body.
            headers={"Connection": "close"},
        )

    async def _read_body(
        self, receive: Receive, tenant: str, body_limit: int, held: list[int]
    ) -> bytes | None:
        """The whole body, or None when the client disconnected first. ``held`` counts
        the bytes held in the process's and the tenant's totals (the caller gives them
        back)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > body_limit:
                    raise _BodyTooLarge
                if full := self.slots.hold(tenant, len(chunk)):
                    raise _BodiesFull(full)
                held[0] += len(chunk)
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse_admission(
        self, scope: Scope, receive: Receive, send: Send, reason: str, tenant: str
    ) -> None:
        limits = self.limits
        if reason == "queue_full":
            detail = (
                f"the server is at capacity ({limits.max_concurrent} requests running and "
                f"{limits.max_queued} more in progress or waiting); retry shortly"
            )
        elif reason == "keyless_queue_full":
            detail = (
                f"requests that need no API key (outside /v1) are at their share: at most "
                f"{limits.places(tenant)} in progress at once; retry shortly"
            )
        else:
            detail = (
                f"this tenant is at its share of the server's capacity "
                f"({self.slots.in_process(tenant)} requests in progress: at most "
                f"{limits.tenant_concurrent} running and {limits.tenant_queued} more waiting); "
                "retry shortly"
            )
        await _refuse(scope, receive, send, reason, detail)

    async def _refuse_bodies(
        self, scope: Scope, receive: Receive, send: Send, reason: str, tenant: str
    ) -> None:
        if reason == "bodies_full":
            detail = (
                f"the server holds {self.slots.buffered} bytes of request bodies, near its "
                f"{self.limits.max_buffered_body_bytes}-byte limit; retry shortly"
            )
        else:
            detail = (
                f"this tenant holds {self.slots.buffered_by(tenant)} bytes of request bodies "
                f"in progress, near its {self.limits.tenant_buffered_body_bytes}-byte share "
                "of the server's; retry shortly"
            )
        await _refuse(scope, receive, send, reason, detail)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's ``receive``: the body read whole as one message, then the client's."""
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()  # after the body: a disconnect, whenever it comes
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _chunked(scope: Scope) -> bool:
    """Whether the request's body comes in chunks (its length is not declared)."""
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # uvicorn's parser refuses it before the app sees it
    return 0


async def _answer(error: ProblemError, scope: Scope, receive: Receive, send: Send) -> None:
    await problem_response(error, scope["path"])(scope, receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, reason: str, detail: str) -> None:
    metrics.HTTP_REJECTED.labels(reason).inc()
    busy = ServiceUnavailable(detail, headers={"Retry-After": "1"})
    await _answer(busy, scope, receive, send)
