"""Idempotency records: what a write answered under a client's ``Idempotency-Key``,
kept per session, so that the same request sent again gets the same answer.

The append reads and keeps its record inside its own two statements
(:mod:`app.store.append`); the other writes that take a key (navigation, forks) use
these, in the transaction of the write they answer for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from app.core.driver import Driver


@dataclass(frozen=True, slots=True)
class Record:
    """A kept answer: the request's hash, its status and its document."""

    request_hash: str
    status_code: int
    response: dict[str, Any]


_READ_SQL = """
SELECT request_hash, status_code, response::text AS response FROM idempotency_record
WHERE session_id = $1 AND tenant_id = $2 AND key = $3
"""
_KEEP_SQL = """
INSERT INTO idempotency_record (session_id, tenant_id, key, request_hash, status_code, response)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
"""
_REPLACE_SQL = """
UPDATE idempotency_record SET response = $4::jsonb
WHERE session_id = $1 AND tenant_id = $2 AND key = $3
"""


async def read(driver: Driver, tenant_id: str, session_id: str, key: str) -> Record | None:
    """The record kept under ``key`` for the session, if there is one."""
    row = await driver.fetchrow(_READ_SQL, session_id, tenant_id, key)
    if row is None:
        return None
    return Record(row["request_hash"], row["status_code"], orjson.loads(row["response"]))


async def keep(
    driver: Driver,
    tenant_id: str,
    session_id: str,
    key: str,
    request_hash: str,
    status_code: int,
    document: dict[str, Any],
) -> None:
    """Keep ``document`` as the answer to the request of ``request_hash`` under ``key``."""
    await driver.execute(
        _KEEP_SQL,
        session_id,
        tenant_id,
        key,
        request_hash,
        status_code,
        orjson.dumps(document).decode(),
    )


async def replace_response(
    driver: Driver, tenant_id: str, session_id: str, key: str, response_json: str
) -> None:
    """The answer kept under ``key`` becomes ``response_json`` (JSON text): an append's,
    once its prune is in it."""
    await driver.execute(_REPLACE_SQL, session_id, tenant_id, key, response_json)
