"""All SQL for API keys, on a bare asyncpg connection (the CLI's and the request path's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.core.driver import Driver, Record, record_of
from app.keys import tokens


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: str
    tenant_id: str
    name: str | None
    secret_sha256: bytes
    created_at: datetime
    revoked_at: datetime | None


_COLUMNS = "id, tenant_id, name, secret_sha256, created_at, revoked_at"


def _key(row: Record | None) -> KeyRow:
    if row is None:  # pragma: no cover - INSERT ... RETURNING answers its row
        raise RuntimeError("no key row")
    return record_of(KeyRow, row)


async def create(driver: Driver, tenant_id: str, name: str | None) -> tuple[KeyRow, str]:
    """A new key for the tenant: its row, and the whole key (shown once, never stored)."""
    new = tokens.generate()
    row = await driver.fetchrow(
        f"INSERT INTO api_key (id, tenant_id, name, secret_sha256) VALUES ($1, $2, $3, $4) "
        f"RETURNING {_COLUMNS}",
        new.id,
        tenant_id,
        name,
        new.secret_sha256,
    )
    return _key(row), new.token


async def get(driver: Driver, key_id: str) -> KeyRow | None:
    row = await driver.fetchrow(f"SELECT {_COLUMNS} FROM api_key WHERE id = $1", key_id)
    return _key(row) if row else None


async def revoke(driver: Driver, key_id: str) -> KeyRow | None:
    """Revoked from now on; revoking twice keeps the first time. None if no such key."""
    row = await driver.fetchrow(
        f"UPDATE api_key SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 "
        f"RETURNING {_COLUMNS}",
        key_id,
    )
    return _key(row) if row else None


async def delete(driver: Driver, key_id: str) -> KeyRow | None:
    """The key is gone, revoked or not; None if there was no such key. Once no key is
    left, the service is open again (see :func:`any_exist`)."""
    row = await driver.fetchrow(f"DELETE FROM api_key WHERE id = $1 RETURNING {_COLUMNS}", key_id)
    return _key(row) if row else None


async def delete_all(driver: Driver, tenant_id: str | None = None) -> list[KeyRow]:
    """Every key (of the tenant, if given) is gone; the rows that were deleted."""
    rows = await driver.fetch(
        f"DELETE FROM api_key WHERE $1::text IS NULL OR tenant_id = $1 RETURNING {_COLUMNS}",
        tenant_id,
    )
    return sorted((_key(r) for r in rows), key=lambda r: (r.tenant_id, r.created_at, r.id))


async def list_keys(driver: Driver, tenant_id: str | None = None) -> list[KeyRow]:
    rows = await driver.fetch(
        f"SELECT {_COLUMNS} FROM api_key WHERE $1::text IS NULL OR tenant_id = $1 "
        "ORDER BY tenant_id, created_at, id",
        tenant_id,
    )
    return [_key(r) for r in rows]


async def any_exist(driver: Driver) -> bool:
    """Whether any key exists. Revoked keys count: revoking the last key must lock
    everyone out, not open the service; deleting every key (``compactd keys delete``)
    is the way back to open mode."""
    return bool(await driver.fetchval("SELECT EXISTS (SELECT 1 FROM api_key)"))
