"""Shared by the webhook tests: the documented verification snippet, a real
dispatcher run until nothing is pending, and the API's webhook calls."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from app.core.database import driver_connection
from app.core.outbound import Outbound
from app.core.settings import Settings
from app.webhooks.dispatcher import Dispatcher
from tests.conftest import TEST_SETTINGS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"

Verify = Callable[..., bool]

# Deliveries retried at once (a few hundredths of a second of backoff), a receiver
# that does not answer given up after a second.
FAST = TEST_SETTINGS.model_copy(
    update={
        "webhook_timeout_seconds": 1.0,
        "webhook_max_attempts": 3,
        "webhook_backoff_base_seconds": 0.01,
        "webhook_backoff_cap_seconds": 0.05,
        "webhook_disable_after_failures": 50,
    }
)


def fast(**changes: Any) -> Settings:
    return FAST.model_copy(update=changes)


def documented_verify() -> Verify:
    """``verify`` as docs/events.md writes it: the ```python block that defines it,
    run as it stands."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    [code] = [b for b in blocks if "def verify(" in b]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOCS), "exec"), namespace)
    verify: Verify = namespace["verify"]
    return verify


async def pending(app: Any) -> int:
    async with driver_connection(app.state.engine) as driver:
        count: int = await driver.fetchval(
            "SELECT count(*) FROM webhook_delivery WHERE status = 'pending'"
        )
    return count


async def dispatch(app: Any, settings: Settings = FAST, *, within: float = 20.0) -> int:
    """Run a real dispatcher until no delivery is pending (each retry when it is
    due); the attempts it made."""
    deadline = time.monotonic() + within
    made = 0
    async with Outbound(settings) as http:
        dispatcher = Dispatcher(app.state.engine, http.webhooks, settings)
        while True:
            made += await dispatcher.run_once()
            if await pending(app) == 0:
                return made
            if time.monotonic() > deadline:
                raise TimeoutError(f"deliveries still pending after {within} s")
            await asyncio.sleep(0.01)


async def create_webhook(
    client: httpx.AsyncClient, headers: dict[str, str] | None = None, **body: Any
) -> dict[str, Any]:
    r = await client.post("/v1/webhooks", json=body, headers=headers or {})
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made


async def delivery_log(
    client: httpx.AsyncClient,
    webhook_id: str,
    headers: dict[str, str] | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Every page of a webhook's delivery log, newest first."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = await client.get(
            f"/v1/webhooks/{webhook_id}/deliveries", params=params, headers=headers or {}
        )
        assert r.status_code == 200, r.text
        page = r.json()
        out.extend(page["deliveries"])
        cursor = page["next_cursor"]
        if cursor is None:
            return out


async def event_log(app: Any, tenant: str = "default") -> list[dict[str, Any]]:
    """Every event of the tenant, in the log's order: id, type, session and data."""
    async with driver_connection(app.state.engine) as driver:
        rows = await driver.fetch(
            "SELECT txid || '-' || id AS id, type, nullif(session_id, '') AS session_id, "
            "data::text AS data FROM event WHERE tenant_id = $1 ORDER BY txid, id",
            tenant,
        )
    return [{**dict(r), "data": orjson.loads(r["data"])} for r in rows]
