"""The bare endpoint that ``python -m bench cpu`` compares a context read with.

One FastAPI route, no middleware, no authentication, no validation beyond the path, on
uvicorn with the options ``compactd serve`` uses (uvloop, httptools): it runs the very
statements a context read runs (the session's state and prune marks, then the window's
rows, from :mod:`app.store.context_reads`) on an asyncpg pool and answers the rows' stored views
as one JSON array. What a context read costs beyond it is the service's own work:
middleware, keys, limits, the window's assembly and the document.

Run as ``python -m bench.bare --port P --dsn postgresql://...``.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import uvicorn
from fastapi import FastAPI, Response

from app.core.tenancy import DEFAULT_TENANT
from app.store.context_reads import _STATE_AND_MARKS_SQL, _WINDOW_SQL
from app.store.paths import OnPath
from app.store.session_row import state_of


def create(dsn: str) -> FastAPI:
    pool: asyncpg.Pool | None = None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        nonlocal pool
        pool = await asyncpg.create_pool(
            dsn, min_size=4, max_size=16, server_settings={"plan_cache_mode": "force_generic_plan"}
        )
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/bare/{session_id}")
    async def bare(session_id: str) -> Response:
        assert pool is not None
        async with pool.acquire() as conn:
            row = await conn.fetchrow(_STATE_AND_MARKS_SQL, session_id, DEFAULT_TENANT)
            if row is None:
                return Response(b"[]", status_code=404, media_type="application/json")
            state = state_of(row)
            at = OnPath.of(session_id, state)
            start, end = state.context_start_seq, state.next_seq
            rows = await conn.fetch(
                _WINDOW_SQL["openai"],
                at.family_id,
                DEFAULT_TENANT,
                start,
                end,
                *at.args(start, end),
            )
        body = b"[" + b",".join(r["view"].encode() for r in rows) + b"]"
        return Response(body, media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args()
    uvicorn.run(
        create(args.dsn),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
