"""The upstream call: the agent's request with the call's context in place of its
history, sent; an error read and passed on, or, for a context-overflow error that a
relief made room for, the request retried once with the context read again
(docs/proxy.md, "Inside a call", steps 4 and 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from app.context.assembly import Built
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.outbound import redact_url
from app.engine.accounting import overflow_errors
from app.engine.proxy.wire import upstream_bytes
from app.engine.proxy.wires import wire_of
from app.proxy.answer import Answer
from app.proxy.call import Call, ProxyDeps
from app.proxy.errors import BadGateway, GatewayTimeout
from app.proxy.forward import agent_headers, with_query
from app.proxy.relief import relieved
from app.proxy.replies import later, record
from app.store.session_row import record_served

# The most of an upstream error body read (for the overflow classifier, and passed on).
MAX_ERROR_BYTES = 4 * 1024 * 1024
# The most of a whole reply read.
MAX_REPLY_BYTES = 64 * 1024 * 1024


def with_context(call: Call, context: Built) -> bytes:
    """The agent's request with ``context`` in place of its history, as JSON."""
    call.version = context.version
    call.sent_tokens = context.tokens
    call.sent = context
    if call.offered is not None:
        return upstream_bytes(call.offered.request, context.messages, context.system)
    return wire_of(call.request).upstream(call.request, context.messages, context.system)


async def served(deps: ProxyDeps, driver: Driver, session_id: str, context: Built) -> None:
    """Record ``context`` as the one served, as GET /context does (a usage report
    without ``context_version`` is about it)."""
    await record_served(driver, deps.tenant_id, session_id, context.state)


async def fresh_context(deps: ProxyDeps, call: Call) -> Built:
    """The context read again (after a relief, for the retry), recorded as served."""
    async with driver_connection(deps.engine) as driver:
        context = await deps.client.contexts.fresh(
            driver,
            deps.tenant_id,
            call.session_id,
            call.request.api,
            call.created_at,
            system_messages=call.system_messages,
        )
        await served(deps, driver, call.session_id, context)
    return context


async def send(deps: ProxyDeps, call: Call, content: bytes) -> httpx.Response:
    """The request sent upstream; its answer's head (the body streams after)."""
    call.attempts += 1
    url = deps.client.urls[call.request.wire]
    url = with_query(url, deps.query)
    upstream = deps.http.build_request("POST", url, content=content, headers=call.headers)
    try:
        return await deps.http.send(upstream, stream=True)
    except httpx.TimeoutException:
        # The URL as shown has no credential (a user:password@ or a key= the operator
        # put in it): the answer goes to any agent.
        raise GatewayTimeout(
            f"the upstream ({redact_url(url)}) did not answer within "
            f"{deps.settings.proxy_timeout_seconds:g} s"
        ) from None
    except httpx.HTTPError as exc:
        raise BadGateway(
            f"the upstream ({redact_url(url)}) could not be reached: {type(exc).__name__}"
        ) from None


async def refused(
    deps: ProxyDeps, call: Call, response: httpx.Response, release: Callable[[], None]
) -> httpx.Response | Answer:
    """``response`` when it is not an error. An error is the agent's answer, but for
    an overflow on the call's first request that a relief made room for: then the
    retry's response, or its error."""
    if response.status_code < 400:
        return response
    raw = await read_limited(response, MAX_ERROR_BYTES)
    verdict = overflow_errors.classify(response.status_code, raw.decode("utf-8", "replace"))
    if verdict.overflow and await relieved(deps, call, response.status_code, raw, verdict):
        response = await send(deps, call, with_context(call, await fresh_context(deps, call)))
        if response.status_code < 400:
            return response
        raw = await read_limited(response, MAX_ERROR_BYTES)
    later(deps, call, record(deps, call), release)
    return Answer(response.status_code, agent_headers(response.headers), raw, holds_turn=True)


async def abandon(sending: asyncio.Future[httpx.Response]) -> None:
    """Give up an upstream request on its way: cancelled, or, if its answer came
    already, that answer closed."""
    sending.cancel()
    await asyncio.wait([sending])  # what it raised, if anything, is its own
    if not sending.cancelled() and sending.exception() is None:
        await sending.result().aclose()


async def read_limited(response: httpx.Response, limit: int) -> bytes:
    """The response's body, at most ``limit`` bytes of it; the response is closed."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    except httpx.TimeoutException:
        raise GatewayTimeout("the upstream stopped answering mid-reply") from None
    except httpx.HTTPError as exc:
        raise BadGateway(f"the upstream broke off its reply: {type(exc).__name__}") from None
    finally:
        await response.aclose()
    return b"".join(chunks)[:limit]
