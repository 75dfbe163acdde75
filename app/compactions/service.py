"""Compaction use cases of the API: requesting one (and waiting for it), listing,
cancelling, and reading the archive of what one replaced. The pivot itself
moves in :mod:`app.compactions.pivot`."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions.pivot import enqueue_locked, prepare, transition
from app.compactions.repository import CompactionRepository, JobRow
from app.compactions.schemas import (
    CompactionOut,
    CompactionPage,
    CompactionRequest,
    CompactionUsage,
    SourcePage,
    TenantUsage,
    UsageHour,
)
from app.core import cursors, metrics
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import Conflict, NotFound
from app.engine.accounting.summarizer_spend import Spend, hour_of
from app.history.schemas import Format
from app.history.service import HistoryService
from app.sessions import service as sessions
from app.sessions.schemas import SummarizerUsage
from app.store import branches
from app.store import spend as tenant_spend
from app.store.session_row import exists, locked, read_state

FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def to_schema(job: JobRow) -> CompactionOut:
    return CompactionOut(
        id=job.id,
        session_id=job.session_id,
        status=job.status,
        reason=job.reason,
        auto=job.auto,
        strategy=job.strategy,
        summarizer=job.summarizer,
        summarizer_used=job.summarizer_used,
        attempts=job.attempts,
        cancel_requested=job.cancel_requested,
        summary=job.summary,
        short_summary=job.short_summary,
        first_kept_seq=job.first_kept_seq,
        entry_seq=job.entry_seq,
        tokens_before=job.tokens_before,
        tokens_after=job.tokens_after,
        details=job.details,
        error=job.error,
        upstream_model=job.upstream_model,
        upstream_usage=job.upstream_usage,
        usage=CompactionUsage(
            **_usage(Spend.of(job.upstream_usage, job.summarizer_calls)), model=job.upstream_model
        ),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        next_attempt_at=job.run_after if job.status == "queued" and job.attempts else None,
    )


def _usage(spend: Spend) -> dict[str, int]:
    return {
        "calls": spend.calls,
        "input_tokens": spend.input_tokens,
        "output_tokens": spend.output_tokens,
        "cached_tokens": spend.cached_tokens,
    }


async def tenant_usage(engine_: AsyncEngine, tenant_id: str, limit: int) -> TenantUsage:
    """What compaction cost and saved ``tenant_id``: two rows read, nothing summed."""
    hour = hour_of(datetime.now(UTC))
    async with driver_connection(engine_) as driver:
        totals, current = await tenant_spend.read(driver, tenant_id, hour)
    return TenantUsage(
        summarizer=SummarizerUsage(**_usage(totals.spend)),
        compactions=totals.compactions,
        saved_tokens=totals.saved_tokens,
        limited_compactions=totals.limited_compactions,
        current_hour=UsageHour(
            **_usage(current.spend),
            hour_start=current.hour_start,
            limited_compactions=current.limited_compactions,
        ),
        tokens_per_hour_limit=limit or None,
        updated_at=totals.updated_at,
    )


# --- the API ------------------------------------------------------------------


class CompactionService:
    def __init__(
        self, engine_: AsyncEngine, tenant_id: str, wake: asyncio.Event | None = None
    ) -> None:
        self.engine = engine_
        self.tenant_id = tenant_id
        self.repo = CompactionRepository(tenant_id)
        self.wake = wake

    async def request(self, session_id: str, body: CompactionRequest) -> CompactionOut:
        """A manual compaction: the session's active one if it has one, else a new
        job; 409 when there is nothing to compact."""
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                state, driver = unit.state, unit.driver
                config = sessions.effective_config(state.config)
                if not config.compaction.enabled:
                    raise Conflict(
                        "compaction is disabled for this session (config.compaction.enabled)"
                    )
                job = None
                if state.active_compaction_id is not None:
                    job = await self.repo.get(driver, session_id, state.active_compaction_id)
                if job is None or job.status in FINISHED:
                    # Is there anything to cut? The worker reads the content itself.
                    prepared = await prepare(
                        driver, self.tenant_id, session_id, state, config, light=True
                    )
                    if prepared is None:
                        raise Conflict(
                            "nothing to compact: the history since the last compaction fits in "
                            f"keep_recent_tokens, or has no point to cut at "
                            f"({state.next_seq - state.context_start_seq} entries since the pivot)"
                        )
                    out = await enqueue_locked(
                        unit,
                        config,
                        reason="manual",
                        auto=False,
                        request=body,
                    )
                    job_id = out.id
                else:
                    job_id = job.id
        if self.wake is not None:
            self.wake.set()
        return to_schema(await self._wait(session_id, job_id, body.wait))

    async def _wait(self, session_id: str, job_id: uuid.UUID, seconds: float) -> JobRow:
        """Poll the job until it finishes or ``seconds`` pass, holding a pooled
        connection only for each read: waiting clients must not starve the
        workers they wait for."""
        deadline = time.monotonic() + seconds
        pause = 0.01
        while True:
            async with driver_connection(self.engine) as driver:
                job = await self.repo.get(driver, session_id, job_id)
            if job is None:
                raise NotFound(f"compaction {job_id} does not exist")
            if job.status in FINISHED or time.monotonic() >= deadline:
                return job
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)

    async def list(self, session_id: str, *, limit: int, cursor: str | None) -> CompactionPage:
        before = cursors.decode(cursor) if cursor else None
        async with driver_connection(self.engine) as driver:
            await self._session_exists(driver, session_id)
            jobs = await self.repo.page(driver, session_id, limit=limit + 1, before=before)
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return CompactionPage(
            compactions=[to_schema(j) for j in jobs],
            next_cursor=cursors.encode(jobs[-1].created_at, jobs[-1].id) if more else None,
        )

    async def get(self, session_id: str, compaction_id: uuid.UUID) -> CompactionOut:
        async with driver_connection(self.engine) as driver:
            return to_schema(await self._job(driver, session_id, compaction_id))

    async def cancel(self, session_id: str, compaction_id: uuid.UUID) -> CompactionOut:
        """A queued job is cancelled at once; a running one is asked to stop and
        never commits. A finished one cannot be cancelled (409)."""
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                state, driver = unit.state, unit.driver
                job = await self._job(driver, session_id, compaction_id)
                if job.status in FINISHED:
                    raise Conflict(f"compaction {compaction_id} already {job.status}")
                cancelled = await self.repo.cancel(driver, session_id, compaction_id)
                if cancelled is None:  # pragma: no cover - the session lock orders finishing
                    raise Conflict(f"compaction {compaction_id} already finished")
                if cancelled.status == "cancelled":  # it was queued: no worker will say so
                    transition(
                        "cancelled",
                        cancelled.reason,
                        cancelled.id,
                        session_id,
                        self.tenant_id,
                        detail="cancelled while queued",
                    )
                if cancelled.status == "cancelled" and state.active_compaction_id == compaction_id:
                    state.active_compaction_id = None
                    await unit.save()
                return to_schema(cancelled)

    async def source(
        self,
        session_id: str,
        compaction_id: uuid.UUID,
        *,
        after_seq: int,
        limit: int,
        fmt: Format,
    ) -> SourcePage:
        """The entries the compaction replaced, as stored, a page at a time."""
        async with driver_connection(self.engine) as driver:
            job = await self._job(driver, session_id, compaction_id)
            if job.status != "succeeded" or job.first_kept_seq is None:
                raise Conflict(f"compaction {compaction_id} is {job.status}: it replaced nothing")
            # What it replaced is on the path to its entry, which the session may
            # have left since (a navigation): that path, not the session's.
            state = await read_state(driver, self.tenant_id, session_id)
            family = session_id if state is None else state.family_id
            path = await branches.path_to_compaction(driver, self.tenant_id, family, compaction_id)
        if job.source_start_seq is None:
            raise Conflict(f"compaction {compaction_id} is {job.status}: it replaced nothing")
        page = await HistoryService(self.engine, self.tenant_id).history(
            session_id,
            after_seq=max(after_seq, job.source_start_seq - 1),
            limit=limit,
            fmt=fmt,
            before_seq=job.first_kept_seq,
            replaced_only=True,
            path=path,
        )
        return SourcePage(
            compaction_id=job.id, entries=page.entries, next_after_seq=page.next_after_seq
        )

    async def _session_exists(self, driver: Driver, session_id: str) -> None:
        if not await exists(driver, self.tenant_id, session_id):
            raise NotFound(f"session {session_id!r} does not exist")

    async def _job(self, driver: Driver, session_id: str, compaction_id: uuid.UUID) -> JobRow:
        job = await self.repo.get(driver, session_id, compaction_id)
        if job is None:
            await self._session_exists(driver, session_id)
            raise NotFound(f"compaction {compaction_id} does not exist")
        return job
