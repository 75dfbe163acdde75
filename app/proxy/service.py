"""A proxied model call: the agent's request in, the managed context upstream, the reply
back and into the stored history. The pipeline's steps, each in its own module, and the
rules they keep are written in docs/proxy.md ("Inside a call")."""

from __future__ import annotations

import asyncio
import time

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection
from app.core.settings import Settings
from app.engine.proxy import responses_format
from app.engine.proxy.wire import ProxyRequest, Wire
from app.proxy.answer import Answer
from app.proxy.call import Call, ProxyDeps
from app.proxy.exchange import exchange
from app.proxy.forward import ProxyClient
from app.proxy.placement import prepare
from app.proxy.recall import recall_exchange
from app.proxy.relief import compact_now
from app.proxy.replays import replayed
from app.proxy.replies import record
from app.proxy.repository import KnownRow, ProxyRepository, StoredMessage
from app.proxy.request import read_body, session_id_of
from app.proxy.turns import turns
from app.proxy.upstream import abandon, fresh_context, send, served, with_context


class ProxyService:
    """Proxied model calls of one tenant."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        client: ProxyClient,
        settings: Settings,
        tenant_id: str,
        query: bytes = b"",
    ) -> None:
        self.deps = ProxyDeps(
            engine=engine,
            client=client,
            http=client.get(),
            settings=settings,
            tenant_id=tenant_id,
            repo=ProxyRepository(tenant_id),
            query=query,
        )

    async def call(
        self, api: Wire, session_id: str | None, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer:
        """Serve one proxied call (docs/proxy.md, "Inside a call")."""
        deps = self.deps
        session_id = session_id_of(session_id)
        key = (deps.tenant_id, session_id)
        # A free turn is taken before the body is parsed, and what the proxy knows of the
        # history is read meanwhile (it needs the session's id only; a large body takes
        # milliseconds to parse). When another call has the turn, the body is read first,
        # so that a bad one gets its 400 without waiting.
        request = None if not turns.busy(key) else read_body(api, body)
        release = await turns.take(key, deps.settings.proxy_timeout_seconds)
        handed_over = False
        try:
            # One connection for the known history, the append and the context.
            async with driver_connection(deps.engine) as driver:
                first: asyncio.Future[KnownRow | None] | None = None
                if request is None:
                    first = asyncio.ensure_future(deps.repo.known(driver, session_id))
                    request = await _read_meanwhile(api, body, first)
                prepared = await prepare(
                    deps, driver, request, session_id, len(body), headers, first
                )
                if isinstance(prepared, StoredMessage):
                    return replayed(request, session_id, prepared)
                # The request goes upstream now; the context is recorded as served, and
                # the connection given back, while it is on its way.
                sending = asyncio.ensure_future(
                    send(deps, prepared, with_context(prepared, prepared.context))
                )
                try:
                    await served(deps, driver, prepared.session_id, prepared.context)
                except BaseException:
                    await abandon(sending)
                    raise
            run = recall_exchange if prepared.offered is not None else exchange
            answer = await run(deps, prepared, release, sending)
            handed_over = answer.holds_turn
            return answer
        finally:
            if not handed_over:
                release()

    async def compact(
        self, session_id: str | None, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer:
        """``POST /responses/compact``: the agent's remote-compaction request, answered
        with compactd's own compaction, never the upstream's. The request's history is
        matched and its new items stored as a call's are, the session is compacted on
        the spot (extractive: stored, listed and undoable as any compaction), and the
        answer's ``output`` is the session's context now, as Responses items (the
        summary, then the history kept), for the agent to carry on from."""
        deps = self.deps
        session_id = session_id_of(session_id)
        key = (deps.tenant_id, session_id)
        request = read_body("responses", body)
        release = await turns.take(key, deps.settings.proxy_timeout_seconds)
        try:
            async with driver_connection(deps.engine) as driver:
                prepared = await prepare(deps, driver, request, session_id, len(body), headers)
            assert isinstance(prepared, Call)  # a Responses call is never a replay
            compacted = await compact_now(deps, prepared.session_id, asked=True)
            context = await fresh_context(deps, prepared)
            await record(deps, prepared)
        finally:
            release()
        return _compacted(
            request, prepared.session_id, context.messages, context.version, compacted
        )


async def _read_meanwhile(
    api: Wire, body: bytes, first: asyncio.Future[KnownRow | None]
) -> ProxyRequest:
    """The agent's request, read while ``first`` (the known history's read) is on its
    way; a body's error is the answer, once that read has given the connection back."""
    await asyncio.sleep(0)  # the read is on its way
    try:
        return read_body(api, body)
    except BaseException:
        await asyncio.wait([first])  # the connection is free again
        if not first.cancelled():
            first.exception()  # the body's error is the answer
        raise


def _compacted(
    request: ProxyRequest, session_id: str, messages: bytes, version: int, compacted: bool
) -> Answer:
    """The answer to ``/responses/compact``: the context now as Responses items."""
    output = responses_format.to_items(
        orjson.loads(messages), responses_format.custom_tools(request.body.get("tools"))
    )
    answer = {
        "id": f"resp_compactd_{session_id}_{version}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "model": request.model,
        "output": output,
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }
    return Answer(
        200,
        {"content-type": "application/json", "x-compactd-compacted": str(compacted).lower()},
        orjson.dumps(answer),
    )
