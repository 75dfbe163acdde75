"""The summarizer's spend per tenant: ``tenant_summarizer_usage`` (since the start)
and ``tenant_summarizer_hour`` (per hour, what the spend limit reads).

Both are added to when a compaction (or a branch summary) commits, in its
transaction, by one statement (:func:`record`): counted once, on write. A read is
one row of each (:func:`read`, :func:`hour_tokens`), never a sum over the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.core.driver import Driver
from app.engine.accounting.summarizer_spend import Spend

# How long hour rows are kept: the limit reads the current one only; a week of them
# says when a tenant spent, and keeps the table at 168 rows per active tenant.
KEEP_HOURS = 168

_RECORD_SQL = f"""
WITH total AS (
    INSERT INTO tenant_summarizer_usage AS t (tenant_id, calls, input_tokens, output_tokens,
        cached_tokens, compactions, saved_tokens, limited_compactions, updated_at)
    VALUES ($1, $3, $4, $5, $6, $7, $8, $9, now())
    ON CONFLICT (tenant_id) DO UPDATE SET
        calls = t.calls + excluded.calls,
        input_tokens = t.input_tokens + excluded.input_tokens,
        output_tokens = t.output_tokens + excluded.output_tokens,
        cached_tokens = t.cached_tokens + excluded.cached_tokens,
        compactions = t.compactions + excluded.compactions,
        saved_tokens = t.saved_tokens + excluded.saved_tokens,
        limited_compactions = t.limited_compactions + excluded.limited_compactions,
        updated_at = now()
    RETURNING 1
), hour AS (
    INSERT INTO tenant_summarizer_hour AS h (tenant_id, hour_start, calls, input_tokens,
        output_tokens, cached_tokens, limited_compactions)
    VALUES ($1, $2, $3, $4, $5, $6, $9)
    ON CONFLICT (tenant_id, hour_start) DO UPDATE SET
        calls = h.calls + excluded.calls,
        input_tokens = h.input_tokens + excluded.input_tokens,
        output_tokens = h.output_tokens + excluded.output_tokens,
        cached_tokens = h.cached_tokens + excluded.cached_tokens,
        limited_compactions = h.limited_compactions + excluded.limited_compactions
    RETURNING 1
), old AS (
    DELETE FROM tenant_summarizer_hour
    WHERE tenant_id = $1 AND hour_start < $2 - interval '{KEEP_HOURS} hours'
)
SELECT 1 FROM total, hour
"""

_HOUR_TOKENS_SQL = """
SELECT input_tokens + output_tokens FROM tenant_summarizer_hour
WHERE tenant_id = $1 AND hour_start = $2
"""

_TOTAL_SQL = """
SELECT calls, input_tokens, output_tokens, cached_tokens, compactions, saved_tokens,
    limited_compactions, updated_at
FROM tenant_summarizer_usage WHERE tenant_id = $1
"""
_HOUR_SQL = """
SELECT calls, input_tokens, output_tokens, cached_tokens, limited_compactions
FROM tenant_summarizer_hour WHERE tenant_id = $1 AND hour_start = $2
"""


@dataclass(frozen=True, slots=True)
class TenantTotals:
    """A tenant's row of ``tenant_summarizer_usage`` (zeros before its first)."""

    spend: Spend
    compactions: int
    saved_tokens: int
    limited_compactions: int
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class HourTotals:
    """A tenant's row of ``tenant_summarizer_hour`` for one hour (zeros when none)."""

    hour_start: datetime
    spend: Spend
    limited_compactions: int


async def record(
    driver: Driver,
    tenant_id: str,
    hour: datetime,
    spend: Spend,
    *,
    compactions: int,
    saved_tokens: int,
    limited: bool,
) -> None:
    """Add a compaction's spend (and ``compactions`` committed, ``saved_tokens``
    removed from the context, whether the limit made it extractive) to the tenant's
    totals and to its hour ``hour``, in the caller's transaction."""
    await driver.fetchval(
        _RECORD_SQL,
        tenant_id,
        hour,
        spend.calls,
        spend.input_tokens,
        spend.output_tokens,
        spend.cached_tokens,
        compactions,
        saved_tokens,
        int(limited),
    )


async def hour_tokens(driver: Driver, tenant_id: str, hour: datetime) -> int:
    """Input plus output tokens the tenant's summarizer calls took in ``hour``."""
    value = await driver.fetchval(_HOUR_TOKENS_SQL, tenant_id, hour)
    return int(value or 0)


async def read(driver: Driver, tenant_id: str, hour: datetime) -> tuple[TenantTotals, HourTotals]:
    """The tenant's totals and its figures for ``hour``."""
    row = await driver.fetchrow(_TOTAL_SQL, tenant_id)
    totals = TenantTotals(Spend(), 0, 0, 0, None)
    if row is not None:
        totals = TenantTotals(
            Spend(row["calls"], row["input_tokens"], row["output_tokens"], row["cached_tokens"]),
            row["compactions"],
            row["saved_tokens"],
            row["limited_compactions"],
            row["updated_at"],
        )
    now = await driver.fetchrow(_HOUR_SQL, tenant_id, hour)
    current = HourTotals(hour, Spend(), 0)
    if now is not None:
        current = HourTotals(
            hour,
            Spend(now["calls"], now["input_tokens"], now["output_tokens"], now["cached_tokens"]),
            now["limited_compactions"],
        )
    return totals, current
