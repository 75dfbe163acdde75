"""The FastAPI application."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request

from app import __version__
from app.budget.router import router as budget_router
from app.compactions.router import router as compactions_router
from app.compactions.usage_router import router as usage_router
from app.compactions.worker import WorkerConfig, WorkerPool, listen_dsn
from app.context.router import fast_routes as context_fast
from app.context.router import router as context_router
from app.core import direct as fast
from app.core import metrics, model_catalog
from app.core.database import (
    create_engine,
    driver_bounds,
    resolve_database_url,
    worker_settings,
)
from app.core.http import install_error_handlers
from app.core.limits import LimitMiddleware, Limits
from app.core.media import require_json_body, takes_input
from app.core.observability import RequestLogMiddleware
from app.core.openapi import install_problem_openapi
from app.core.outbound import Outbound
from app.core.settings import Settings, get_settings
from app.core.storable import check_parsed, check_query, check_utf8
from app.core.tokenizer import load_encodings
from app.engine.accounting.tokens import register_encodings
from app.events.hub import EventHub
from app.events.router import router as events_router
from app.health.router import router as health_router
from app.keys.auth import AuthMiddleware, KeyStore, document_bearer_auth
from app.mcp import server as mcp_server
from app.messages.router import fast_routes as messages_fast
from app.messages.router import router as messages_router
from app.proxy.errors import ProviderErrorShape
from app.proxy.forward import ProxyClient
from app.proxy.router import router as proxy_router
from app.recall.router import router as recall_router
from app.recall.tools_router import router as recall_tools_router
from app.serving.docs import install_docs
from app.sessions.router import router as sessions_router
from app.tree.router import router as tree_router
from app.webhooks.dispatcher import Dispatcher
from app.webhooks.router import router as webhooks_router


async def reject_unstorable_text(request: Request) -> None:
    """NUL characters and lone surrogates are refused (422 naming the field), never stored;
    so are integers beyond 64 bits and numbers that are not finite, which the JSON encoder
    cannot write, and arrays or objects nested too deep or over ``max_json_items`` (before
    the body's validation walks them). The checks are app.core.storable's."""
    if request.url.path.startswith("/proxy/"):
        return  # the proxy checks the messages it stores (its bodies carry whole histories)
    route = request.scope.get("route")
    if route is not None and not takes_input(route):
        return  # /healthz, /metrics: nothing to refuse, so no 422 to document
    check_query(request.query_params.multi_items(), request.headers.get("idempotency-key"))
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()
    require_json_body(route, request.headers.get("content-type"), body)
    check_utf8(body)
    if not body:
        return
    try:
        # FastAPI has parsed a JSON body already (the stdlib's json, which keeps integers
        # beyond 64 bits and lone surrogates) and Starlette keeps the result: walking
        # it costs far less than scanning the raw bytes for escapes.
        parsed = await request.json()
    except (ValueError, RecursionError):
        return  # not JSON (or too deep to parse): the body validation reports it
    await check_parsed(parsed, len(body), request.app.state.settings.max_json_items)


def create_app(
    settings: Settings | None = None, database_url: str | None = None, *, direct: bool = True
) -> FastAPI:
    """The app; ``database_url`` (asyncpg) wins over settings, for tests. ``direct``: the
    fast routes (app.core.direct); off, FastAPI's routes answer every request (the tests
    that compare the two)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Built once per process (the first app's start-up), not on the first request
        # that needs them.
        register_encodings(load_encodings())
        # The operator's model catalog, this process's while the app runs.
        catalog_before = model_catalog.use(settings.catalog)
        url = database_url or resolve_database_url(settings)
        engine = create_engine(url, settings)
        app.state.engine = engine
        app.state.keys = KeyStore(engine, settings.auth_cache_seconds)
        app.state.proxy = ProxyClient(settings)
        app.state.metrics = metrics.app_registry(engine)
        # One client and pool per outbound purpose, each following the outbound policy.
        app.state.outbound = outbound = Outbound(settings)
        app.state.compaction_wake = wake = asyncio.Event()
        # The workers' statements may take longer than a request's: an engine of their own.
        worker_engine = create_engine(url, worker_settings(settings))
        workers = WorkerPool(
            worker_engine,
            WorkerConfig.from_settings(settings),
            outbound,
            count=settings.compaction_workers,
            grace_seconds=settings.compaction_shutdown_grace_seconds,
            wake=wake,
            extras=[Dispatcher(engine, outbound.webhooks, settings)],
        )
        app.state.event_hub = hub = EventHub(listen_dsn(engine), driver_bounds(engine))
        hub.start()
        # The served process then freezes the collector's view of the heap
        # (app.serving.server.serve): serve-only work, which test apps do not pay.
        workers.start()
        try:
            async with mcp_server.running(app.state):  # /mcp's session manager
                yield
        finally:
            await hub.close()
            await workers.close()
            await outbound.aclose()
            await app.state.proxy.aclose()
            await worker_engine.dispose()
            await engine.dispose()
            model_catalog.use(catalog_before)

    app = FastAPI(
        title="compactd",
        version=__version__,
        summary="Conversation history and context windows for LLM agents.",
        description=(
            "compactd stores an agent's conversation history in Postgres and hands it, before "
            "every model call, a context that fits its model's window. Errors are RFC 9457 "
            "`application/problem+json`."
        ),
        lifespan=lifespan,
        dependencies=[Depends(reject_unstorable_text)],
        # /docs and /redoc come from install_docs: the bundled assets, not a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    install_docs(app)
    install_error_handlers(app)
    install_problem_openapi(app, document_bearer_auth)
    # Outermost last: request id and log -> API key -> limits (admission, the body and
    # its size, a fair slot), then the router. The key is checked first: a request
    # without one never takes a place that a tenant's request could have.
    app.add_middleware(LimitMiddleware, limits=Limits.from_settings(settings))
    app.add_middleware(AuthMiddleware)
    app.add_middleware(ProviderErrorShape)  # the proxy's errors in its provider's shape
    app.add_middleware(RequestLogMiddleware)
    for router in (
        health_router,
        sessions_router,
        messages_router,
        context_router,
        budget_router,
        compactions_router,
        usage_router,
        tree_router,
        recall_router,
        recall_tools_router,
        events_router,
        webhooks_router,
        proxy_router,
    ):
        app.include_router(router)
    app.router.routes.append(mcp_server.route())  # /mcp
    if direct:
        fast.install(app, [*messages_fast(), *context_fast()])  # at the router's head
    return app
