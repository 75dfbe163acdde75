"""The compaction worker: claims jobs, summarizes, commits exactly once.

A job is claimed in one short statement (``FOR UPDATE SKIP LOCKED``), with a
lease the worker extends while it works. The summary is made with no
transaction and no pooled connection held. The commit is a second short
transaction that checks, under the session's row lock, that the job is still
this claim's (``attempts`` is the fencing token) and that the session's pivot
has not moved since the plan was made; entries appended meanwhile are after
the cut and stay. A worker that dies leaves its job to be claimed again when
the lease ends.

Workers sleep until a ``NOTIFY`` on the jobs channel (or a wake-up from the API
in the same process), and poll as the fallback. The recall indexer
(app.store.search_index) and the webhook dispatcher run beside them, each woken by
its own channel.

The continuity gate (:mod:`app.engine.compaction.continuity`) has completed the summary
before the commit; the job's details record what it found (``gate``), whether the
summary is committed or not. Its block never makes a compaction that would save
tokens without it into one that does not: when the commit finds the context would
not be smaller, and would be without the block, the block's last items are
dropped to fit (``gate.trimmed``) and the commit is made again.

What the summarizer cost is counted when the job commits, in that transaction
(:func:`app.compactions.pivot.record_cost`): its usage summed over every request
of the claim (a plan made again after the pivot moved included), and its requests
(``Summarized.calls``). Before asking the
operator's upstream, the worker reads what the tenant spent this hour: at or past
``COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR`` the summary is extractive, and its
notes say why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions import branch, hooks
from app.compactions.pivot import (
    NoGain,
    Prepared,
    commit_pivot,
    outcome,
    pivot_unchanged,
    prepare,
    record_cost,
    transition,
)
from app.compactions.repository import CHANNEL, CompactionRepository, JobRow
from app.compactions.summarizer import Backoff, Llm, RetryLater, Summarized, summarize
from app.core import metrics
from app.core.database import (
    DriverBounds,
    driver_bounds,
    driver_connection,
    listen_url,
    unavailable_cause,
)
from app.core.driver import Driver
from app.core.outbound import Outbound
from app.core.settings import Settings
from app.engine.accounting import catalog, tokens
from app.engine.accounting.relief import FAILURE_LIMIT
from app.engine.accounting.summarizer_spend import (
    Spend,
    add_usage,
    hour_of,
    limit_note,
    over_limit,
)
from app.engine.compaction import branch_summary, continuity
from app.engine.compaction.prepare import summary_entry_tokens
from app.engine.compaction.summary import serialize_conversation
from app.sessions import service as sessions
from app.store import spend as tenant_spend
from app.store.search_index import Indexer
from app.store.session_row import Unit, lock, read_state
from app.upstream.client import UpstreamConfig, backoff_delay
from app.upstream.remote import RemoteEndpoint

log = logging.getLogger("compactd.worker")

T = TypeVar("T")

# Claims beyond max_attempts that a job may take when its workers keep dying.
CRASH_SLACK = 2
REPLANS = 3


_MOVED_ON = (
    "the session moved on while its branch summary was written (an append or another "
    "navigation): the navigation is called off; navigate again"
)


class LeaseLost(Exception):
    """Another claim owns the job now (the lease ended): stop, commit nothing."""


class CancelRequested(Exception):
    """The job was cancelled through the API while running."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    lease_seconds: float = 30.0
    poll_seconds: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)
    upstream: UpstreamConfig | None = None
    upstream_model: str | None = None
    # A session's compaction.remote_endpoint: how long one request may take.
    remote_timeout_seconds: float = 120.0
    # COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR (0: no limit).
    summarizer_tokens_per_tenant_hour: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerConfig:
        upstream = None
        if settings.upstream_base_url:
            key = settings.upstream_api_key
            upstream = UpstreamConfig(
                api=settings.upstream_api,
                base_url=settings.upstream_base_url,
                api_key=key.get_secret_value() if key is not None else None,
                timeout_seconds=settings.upstream_timeout_seconds,
                max_output_tokens=settings.upstream_max_output_tokens,
            )
        return cls(
            lease_seconds=settings.compaction_lease_seconds,
            poll_seconds=settings.compaction_poll_seconds,
            backoff=Backoff(
                base_seconds=settings.compaction_backoff_base_seconds,
                cap_seconds=settings.compaction_backoff_cap_seconds,
                max_attempts=settings.compaction_max_attempts,
            ),
            upstream=upstream,
            upstream_model=settings.upstream_model,
            remote_timeout_seconds=settings.upstream_timeout_seconds,
            summarizer_tokens_per_tenant_hour=settings.summarizer_tokens_per_tenant_hour,
        )


def worker_name(index: int = 0) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{index}:{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        engine: AsyncEngine,
        config: WorkerConfig,
        outbound: Outbound | None,
        *,
        name: str | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.outbound = outbound  # None: extractive summaries, no hooks
        self.name = name or worker_name()
        self.wake = wake or asyncio.Event()
        self._claimed_at: dict[uuid.UUID, float] = {}

    # --- the loop ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set; a job in hand is finished first."""
        while not stop.is_set():
            try:
                worked = await self.run_once()
            except Exception as exc:  # the database went away, a bug: keep the worker alive
                if unavailable_cause(exc) is not None:
                    log.warning("compaction worker %s: the database is unavailable", self.name)
                else:
                    log.exception("compaction worker %s: job loop failed", self.name)
                worked = False
                await _sleep_or(stop, min(5.0, self.config.poll_seconds * 2))
            if worked or stop.is_set():
                continue
            await _wait_any(stop, self.wake, self.config.poll_seconds)
            self.wake.clear()

    async def run_once(self) -> bool:
        """Claim and run one due job; False when there was none."""
        async with driver_connection(self.engine) as driver:
            job = await CompactionRepository.claim(driver, self.name, self.config.lease_seconds)
        if job is None:
            return False
        self._claimed_at[job.id] = time.perf_counter()
        _transition(job, "claimed", worker=self.name)
        try:
            await self.process(job)
        finally:
            self._claimed_at.pop(job.id, None)
        return True

    # --- one job ----------------------------------------------------------------

    async def process(self, job: JobRow) -> None:
        repo = CompactionRepository(job.tenant_id)
        if job.cancel_requested:
            await self._finish(job, "cancelled", "cancelled while running")
            return
        if job.attempts > self.config.backoff.max_attempts + CRASH_SLACK:
            await self._finish(job, "failed", f"gave up after {job.attempts - 1} claims")
            return
        try:
            if job.reason == branch_summary.KIND:
                await self._branch_summary(job, repo)
                return
            hooked: hooks.Answered | None = None
            # The usage of every summary this claim has had written (a plan made
            # again after the pivot moved asks again): all of it is counted.
            spent: dict[str, int] = {}
            calls = 0
            for _ in range(REPLANS):
                loaded = await self._prepare(job)
                if loaded is None:
                    return  # the session is gone, and the job with it
                prepared, state_model, needed = loaded
                if prepared is None:
                    if job.auto and not needed and job.reason != "overflow":
                        # Another compaction (an emergency one, say) relieved the
                        # window first: this one is not a failure, just late.
                        await self._finish(
                            job, "cancelled", "no longer needed: the context fits again"
                        )
                        return
                    if job.auto or job.reason == "overflow":
                        # An automatic compaction or a recovery that finds nothing to
                        # cut (a pinned system prompt alone past the threshold, say) is
                        # not a failed compaction: it must not stop automatic ones
                        # (three failures do). Held until new history arrives, like a
                        # low yield, so it is not tried again for nothing.
                        await self._finish(
                            job,
                            "cancelled",
                            "nothing to compact: the history since the last compaction is "
                            "what a compaction keeps, or has no point to cut at; not counted "
                            "as a failed automatic compaction",
                            hold=True,
                        )
                        return
                    await self._finish(
                        job,
                        "failed",
                        "nothing to compact: the history since the last compaction fits in "
                        "keep_recent_tokens, or has no point to cut at",
                    )
                    return
                if hooked is None:
                    # Under the lease's heartbeat: hooks may take up to 5 x 30 s.
                    hooked = await self._heartbeat_while(job, self._hooks(job, prepared))
                    if hooked.cancel is not None:
                        await self._finish(
                            job,
                            "cancelled",
                            f"cancelled by a hook: {hooked.cancel}",
                            details={**prepared.plan.details, "hooks": hooked.calls},
                        )
                        return
                _hooked_details(prepared, hooked)
                if hooked.summary is not None:
                    summarized = Summarized(
                        summary=hooked.summary,
                        short_summary=None,
                        used="hook",
                        notes=["the summary came from a hook (from_hook)"],
                    )
                    if await self._commit(job, prepared, summarized, repo):
                        return
                    continue
                # Claims beyond max_attempts come from crashes: no more upstream calls.
                llm = None
                limited: str | None = None
                if job.attempts <= self.config.backoff.max_attempts:
                    llm = await self._llm(job, state_model, prepared.plan.summary_chars)
                    llm, limited = await self._within_limit(job, llm)
                try:
                    summarized = await self._summarize(job, prepared, hooked, llm)
                except RetryLater as later:
                    # The attempt's cost goes with the job to the attempt that commits.
                    later.usage = add_usage(spent, later.usage)
                    later.calls += calls
                    raise
                spent = add_usage(spent, summarized.usage)
                calls += summarized.calls
                summarized.usage = dict(spent)
                if limited is not None:
                    summarized.notes.append(limited)
                if llm is None and self.config.upstream is None and job.summarizer == "llm":
                    summarized.notes.append("no upstream LLM is configured: extractive summary")
                limit_hit = limited is not None
                if await self._commit(job, prepared, summarized, repo, calls, limited=limit_hit):
                    return
                log.info("compaction %s: the pivot moved meanwhile; planning again", job.id)
            await self._finish(job, "failed", "the session's pivot kept moving; try again")
        except RetryLater as later:
            _transition(
                job, "retried", detail=later.reason, retry_in_s=round(later.delay_seconds, 1)
            )
            await self._retry(job, later)
        except LeaseLost:
            _transition(job, "lease_lost", level=logging.WARNING, detail="another worker has it")
        except CancelRequested:
            await self._finish(job, "cancelled", "cancelled while running")
        except asyncio.CancelledError:
            # Shutting down: the job goes back to the queue, not to lease expiry.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._release(job))
            raise
        except Exception as exc:
            # A bug, or the database going away mid-job: recorded on the job and
            # retried after a backoff; claims past max_attempts go extractive. The
            # database going away (a failover, a restart) is expected: no traceback.
            if unavailable_cause(exc) is not None:
                log.warning("compaction %s: the database is unavailable; retried", job.id)
            else:
                log.exception("compaction %s: failed unexpectedly", job.id)
            delay = backoff_delay(
                job.attempts,
                base=self.config.backoff.base_seconds,
                cap=self.config.backoff.cap_seconds,
                retry_after=None,
                rand=self.config.backoff.rand,
            )
            again = RetryLater(delay, f"internal error: {exc!r}"[:500])
            _transition(
                job,
                "retried",
                level=logging.WARNING,
                detail=again.reason,
                retry_in_s=round(delay, 1),
            )
            with contextlib.suppress(Exception):
                await self._retry(job, again)

    async def _summarize(
        self, job: JobRow, prepared: Prepared, hooked: hooks.Answered, llm: Llm | None
    ) -> Summarized:
        """The summary for the prepared plan, under the lease's heartbeat."""
        return await self._heartbeat_while(
            job,
            summarize(
                prepared.plan,
                previous_summary=prepared.previous_summary,
                strategy="narrative" if job.strategy == "narrative" else "structured",
                instructions=job.instructions,
                llm=llm,
                attempt=job.attempts,
                backoff=self.config.backoff,
                prompt=hooked.prompt,
                context=hooked.context,
            ),
        )

    async def _prepare(self, job: JobRow) -> tuple[Prepared | None, str, bool] | None:
        """A plan from one snapshot, the session's model, and whether its verdict
        still asks for compaction. The connection goes back before summarizing."""
        async with (
            driver_connection(self.engine) as driver,
            driver.transaction(isolation="repeatable_read", readonly=True),
        ):
            state = await read_state(driver, job.tenant_id, job.session_id)
            if state is None:
                return None
            config = sessions.effective_config(state.config)
            prepared = await prepare(
                driver, job.tenant_id, job.session_id, state, config, reason=job.reason
            )
            needed = sessions.verdict_of(state, config).action in ("compact", "emergency")
            return prepared, state.model, needed

    async def _llm(self, job: JobRow, session_model: str, summary_chars: int) -> Llm | None:
        """The summarizer: the session's remote endpoint when it has one, else the
        upstream LLM with the job's model then the session's candidates; None for
        the extractive summary."""
        if job.summarizer != "llm" or self.outbound is None:
            return None
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, job.tenant_id, job.session_id)
        wanted = sessions.effective_config(state.config).compaction if state else None
        model = job.model or self.config.upstream_model or session_model
        if wanted is not None and wanted.remote_endpoint is not None:
            remote = RemoteEndpoint(
                url=wanted.remote_endpoint, timeout_seconds=self.config.remote_timeout_seconds
            )
            return Llm(
                lane=self.outbound.remote,
                config=None,
                model=model,
                remote=remote,
                tenant_id=job.tenant_id,
            )
        upstream = self.config.upstream
        if upstream is None:
            return None
        # A summary in proportion to the session's window (about two characters
        # a token of room): a small window is not filled by its own summary.
        limit = min(upstream.max_output_tokens, max(1_024, summary_chars // 2))
        config = dataclasses.replace(upstream, max_output_tokens=limit)
        fallbacks = tuple(wanted.models) if wanted is not None else ()
        return Llm(
            lane=self.outbound.summarizer,
            config=config,
            model=model,
            fallback_models=fallbacks,
            tenant_id=job.tenant_id,
        )

    async def _within_limit(self, job: JobRow, llm: Llm | None) -> tuple[Llm | None, str | None]:
        """``llm``, or None and why when the job's tenant has spent its summarizer
        tokens for this hour (``COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR``). Only the
        operator's upstream is limited: a session's remote endpoint is the tenant's
        own (and reports no usage)."""
        limit = self.config.summarizer_tokens_per_tenant_hour
        if llm is None or llm.remote is not None or limit <= 0:
            return llm, None
        hour = hour_of(datetime.now(UTC))
        async with driver_connection(self.engine) as driver:
            spent = await tenant_spend.hour_tokens(driver, job.tenant_id, hour)
        if not over_limit(spent, limit):
            return llm, None
        return None, limit_note(spent, limit, hour)

    async def _hooks(self, job: JobRow, prepared: Prepared) -> hooks.Answered:
        """What the session's ``compaction.before`` hooks say (app.compactions.hooks)."""
        if self.outbound is None:
            return hooks.Answered()
        found = await hooks.lookup(self.engine, job.tenant_id, job.session_id, "compaction.before")
        if not found:
            return hooks.Answered()  # nothing to serialize the conversation for
        plan = prepared.plan
        conversation = serialize_conversation(plan.history)
        data = {
            "compaction_id": str(job.id),
            "reason": job.reason,
            "auto": job.auto,
            "attempt": job.attempts,
            "source_start_seq": plan.start_seq,
            "first_kept_seq": plan.first_kept_seq,
            "entries": len(plan.history),
            "previous_summary": prepared.previous_summary,
            "conversation": conversation[: hooks.MAX_SUMMARY_CHARS * 2],
        }
        return await hooks.call(
            self.engine,
            self.outbound.hooks,
            found,
            job.tenant_id,
            job.session_id,
            "compaction.before",
            data,
            message_id=f"{job.id}-{job.attempts}",
        )

    async def _heartbeat_while(self, job: JobRow, work: Awaitable[T]) -> T:
        """Run ``work`` while extending the lease; stop it when the lease is lost
        or a cancel is asked."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.lease_seconds / 3)
                if done:
                    return task.result()
                async with driver_connection(self.engine) as driver:
                    cancel = await CompactionRepository(job.tenant_id).heartbeat(
                        driver, job, self.config.lease_seconds
                    )
                if cancel is None:
                    raise LeaseLost
                if cancel:
                    raise CancelRequested
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _owned(
        self, driver: Driver, repo: CompactionRepository, job: JobRow
    ) -> JobRow | None:
        now = await repo.lock_job(driver, job.session_id, job.id)
        if (
            now is None
            or now.status != "running"
            or now.attempts != job.attempts
            or now.lease_owner != job.lease_owner
        ):
            return None
        return now

    async def _commit(
        self,
        job: JobRow,
        prepared: Prepared,
        summarized: Summarized,
        repo: CompactionRepository,
        calls: int = 0,
        *,
        limited: bool = False,
    ) -> bool:
        """Commit the summary, and count what it cost (``calls`` summarizer requests,
        their usage ``summarized.usage``) and saved; False when the pivot moved and the
        plan must be made again. ``limited``: the spend limit made it extractive."""
        async with driver_connection(self.engine) as driver, driver.transaction():
            unit = await lock(driver, job.tenant_id, job.session_id)
            if unit is None:
                return True  # deleted with its jobs
            state = unit.state
            current = await self._owned(driver, repo, job)
            if current is None:
                raise LeaseLost
            if current.cancel_requested:
                raise CancelRequested
            if not pivot_unchanged(state, prepared):
                return False
            # Why earlier attempts were retried (see retry_later) comes first.
            retried = (current.details or {}).get("notes")
            if isinstance(retried, list):
                summarized.notes[:0] = [n for n in retried if isinstance(n, str)]
            # And what they cost: their requests were answered (or billed) all the same.
            earlier = _retried_spend(current)
            if earlier:
                calls += earlier.pop("calls", 0)
                summarized.usage = add_usage(summarized.usage, earlier)
            config = sessions.effective_config(state.config)
            committed = await commit_pivot(
                unit,
                config,
                prepared,
                summarized,
                job_id=job.id,
                auto=job.auto,
                now=datetime.now(UTC),
            )
            if isinstance(committed, NoGain):
                encoding = catalog.lookup(state.model).encoding
                fitted = _fit_gate(summarized, committed, encoding)
                if fitted is not None:
                    summarized = fitted
                    committed = await commit_pivot(
                        unit,
                        config,
                        prepared,
                        summarized,
                        job_id=job.id,
                        auto=job.auto,
                        now=datetime.now(UTC),
                    )
            prepared = _with_gate(prepared, summarized)
            # What the summarizer cost is counted even when nothing is committed.
            spend = await record_cost(
                unit,
                summarized.usage,
                calls=calls,
                job_id=job.id,
                saved_tokens=(
                    0
                    if isinstance(committed, NoGain)
                    else committed.tokens_before - committed.tokens_after
                ),
                committed=not isinstance(committed, NoGain),
                limited=limited,
                now=datetime.now(UTC),
            )
            if isinstance(committed, NoGain):
                # Nothing went wrong, there was nothing to gain: not a failure, and
                # held until new history arrives, as after a low-yield compaction.
                details = {**prepared.plan.details, "notes": summarized.notes}
                await self._end(
                    unit, repo, job, "cancelled", committed.reason, hold=True, details=details
                )
            else:
                fell_back = (
                    job.summarizer == "llm"
                    and summarized.used == "extractive"
                    and (self.config.upstream is not None or summarized.fell_back)
                )
                error = "; ".join(summarized.notes) if fell_back and summarized.notes else None
                await repo.succeed(
                    driver,
                    job,
                    outcome(prepared, summarized, committed, error=error),
                )
        _spent(job, spend, limited)
        if isinstance(committed, NoGain):
            _transition(job, "cancelled", detail=committed.reason)
            return True
        seconds = time.perf_counter() - self._claimed_at.get(job.id, time.perf_counter())
        metrics.committed(
            job.reason, summarized.used, seconds, committed.tokens_before, committed.tokens_after
        )
        _transition(
            job,
            "succeeded",
            count=False,
            summarizer=summarized.used,
            tokens_before=committed.tokens_before,
            tokens_after=committed.tokens_after,
            duration_ms=round(seconds * 1000, 2),
            detail=error,
        )
        return True

    async def _branch_summary(self, job: JobRow, repo: CompactionRepository) -> None:
        """A navigation's branch summary (app.compactions.branch): summarize the
        branch it leaves, then move the leaf with the summary after the target."""
        nav = branch.Navigation.of(job)
        if nav is None:
            await self._finish(job, "failed", "the job does not say which branch to summarize")
            return
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, job.tenant_id, job.session_id)
            if state is None:
                return  # deleted with its jobs
            if branch.moved_on(state, nav):
                await self._finish(job, "cancelled", _MOVED_ON)
                return
            plan = await branch.plan_branch(driver, job, state, nav)
        supplied = (job.details or {}).get("hook_summary")
        if isinstance(supplied, str) and supplied.strip():
            # A navigation.before hook wrote it (app.compactions.hooks).
            summarized = Summarized(
                summary=supplied,
                short_summary=None,
                used="hook",
                notes=["the branch summary came from a hook (from_hook)"],
            )
        else:
            llm = None
            limited: str | None = None
            if job.attempts <= self.config.backoff.max_attempts:
                llm = await self._llm(job, state.model, plan.summary_chars)
                llm, limited = await self._within_limit(job, llm)
            summarized = await self._heartbeat_while(
                job,
                summarize(
                    plan,
                    previous_summary=None,
                    strategy="structured",
                    instructions=job.instructions or branch_summary.INSTRUCTIONS,
                    llm=llm,
                    attempt=job.attempts,
                    backoff=self.config.backoff,
                ),
            )
            if limited is not None:
                summarized.notes.append(limited)
        async with driver_connection(self.engine) as driver, driver.transaction():
            unit = await lock(driver, job.tenant_id, job.session_id)
            if unit is None:
                return
            current = await self._owned(driver, repo, job)
            if current is None:
                raise LeaseLost
            if current.cancel_requested:
                raise CancelRequested
            if branch.moved_on(unit.state, nav):
                moved = True
            else:
                moved = False
                done = await branch.commit_branch(
                    unit, job, nav, plan, summarized, now=datetime.now(UTC)
                )
                await repo.succeed(driver, job, done)
            # Spent whether or not the navigation still stands.
            spend = await record_cost(
                unit,
                summarized.usage,
                calls=summarized.calls,
                job_id=job.id,
                saved_tokens=0,
                committed=False,
                now=datetime.now(UTC),
            )
        _spent(job, spend, False)
        if moved:
            await self._finish(job, "cancelled", _MOVED_ON)
            return
        _transition(
            job,
            "succeeded",
            count=False,
            summarizer=summarized.used,
            tokens_before=done.tokens_before,
            tokens_after=done.tokens_after,
        )

    async def _finish(
        self,
        job: JobRow,
        status: str,
        error: str,
        *,
        hold: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        """End a job without a summary: cancelled, or failed (which counts
        against automatic compaction when the job was automatic). ``hold``:
        no automatic compaction until new history arrives."""
        repo = CompactionRepository(job.tenant_id)
        async with driver_connection(self.engine) as driver, driver.transaction():
            unit = await lock(driver, job.tenant_id, job.session_id)
            if unit is None or await self._owned(driver, repo, job) is None:
                return
            failures = await self._end(unit, repo, job, status, error, hold=hold, details=details)
        _transition(job, status, detail=error)
        if failures >= FAILURE_LIMIT and status == "failed" and job.auto:
            log.warning(
                "session %s: %d automatic compactions failed in a row; automatic compaction "
                "is off until a manual one succeeds",
                job.session_id,
                failures,
            )

    async def _end(
        self,
        unit: Unit,
        repo: CompactionRepository,
        job: JobRow,
        status: str,
        error: str,
        *,
        hold: bool,
        details: dict[str, Any] | None = None,
    ) -> int:
        """Record the end on the job and the session's guards, in the caller's
        transaction (session and job locked); the failures in a row now. ``details``
        replace the job's (a summary not committed says what it was)."""
        await repo.finish(unit.driver, job, status, error, details)
        state = unit.state
        if status == "failed" and job.auto:
            state.compaction_failures += 1
        if state.active_compaction_id == job.id:
            state.active_compaction_id = None
        if hold:
            state.compaction_held_seq = state.next_seq
        await unit.save()
        return state.compaction_failures

    async def _release(self, job: JobRow) -> None:
        async with driver_connection(self.engine) as driver:
            await CompactionRepository(job.tenant_id).release(driver, job)
        _transition(job, "released", detail="back to the queue on shutdown")

    async def _retry(self, job: JobRow, later: RetryLater) -> None:
        repo = CompactionRepository(job.tenant_id)
        async with driver_connection(self.engine) as driver, driver.transaction():
            current = await self._owned(driver, repo, job)
            if current is None:
                return
            if not current.cancel_requested:
                spent = _retried_spend(current)
                if later.usage or later.calls:
                    spent = add_usage(spent, {**later.usage, "calls": later.calls})
                await repo.retry_later(
                    driver, job, later.delay_seconds, later.reason, spent or None
                )
        if current.cancel_requested:  # asked after the last heartbeat: not worth a retry
            await self._finish(job, "cancelled", "cancelled while running")
            return
        if later.delay_seconds <= 0:
            self.wake.set()


def _retried_spend(job: JobRow) -> dict[str, int]:
    """What the job's retried attempts cost (their usage summed, and ``calls``),
    as :meth:`CompactionRepository.retry_later` keeps it in the job's details."""
    kept = (job.details or {}).get("retried_spend")
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if isinstance(k, str) and type(v) is int}


def _spent(job: JobRow, spend: Spend, limited: bool) -> None:
    """The committed job's summarizer usage, in the metrics."""
    metrics.summarizer_spent(
        job.reason, spend.calls, spend.input_tokens, spend.output_tokens, spend.cached_tokens
    )
    if limited:
        metrics.summarizer_limited(job.reason)


def _hooked_details(prepared: Prepared, hooked: hooks.Answered) -> None:
    """The hooks' record (and what they gave) in the details the job records."""
    details = prepared.plan.details
    if hooked.calls:
        details["hooks"] = hooked.calls
    if hooked.preserve:
        details["preserve"] = hooked.preserve
    if hooked.summary is not None:
        details["from_hook"] = True
        if hooked.summary_details:
            details["hook_details"] = hooked.summary_details


def _with_gate(prepared: Prepared, summarized: Summarized) -> Prepared:
    """``prepared`` whose plan's details (what the job records) hold the gate's record."""
    if summarized.gate is None:
        return prepared
    details = {**prepared.plan.details, "gate": summarized.gate.to_details()}
    return dataclasses.replace(prepared, plan=dataclasses.replace(prepared.plan, details=details))


def _fit_gate(
    summarized: Summarized, no_gain: NoGain, encoding: tokens.EncodingName
) -> Summarized | None:
    """``summarized`` with its gate's block cut down so that the context comes out
    smaller (its entry ``tokens_after - tokens_before`` tokens and one shorter), or
    None when the block is not what stands in the way: there is none, or the
    summary without it is already too long (not committed either way)."""
    gate, draft = summarized.gate, summarized.draft
    if gate is None or draft is None or gate.completed.empty:
        return None

    def count(text: str) -> int:
        return summary_entry_tokens(text, encoding)

    limit = count(summarized.summary) - (no_gain.tokens_after - no_gain.tokens_before) - 1
    if count(draft.render()) > limit:
        return None
    completion = continuity.Completion(summarized.summary, gate.completed, gate.missing_after)
    fitted = continuity.fit(draft.render, completion, limit, count)
    plan = draft.plan
    still = continuity.check(fitted.summary, continuity.kept_text(plan.kept), plan.anchors)
    return dataclasses.replace(summarized, summary=fitted.summary, gate=gate.refit(fitted, still))


def _transition(job: JobRow, status: str, **fields: Any) -> None:
    transition(
        status, job.reason, job.id, job.session_id, job.tenant_id, attempt=job.attempts, **fields
    )


async def _sleep_or(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float | None) -> None:
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _setter(event: asyncio.Event) -> Any:
    """A callback that sets ``event`` (a connection's termination, a notification)."""

    def set_it(*_: Any) -> None:
        event.set()

    return set_it


class Listener:
    """One connection per process that LISTENs on the jobs channel and wakes the
    workers; reconnects on failure (the workers poll meanwhile). ``bounds`` are the
    engine's client-side timeouts (see ``driver_bounds``): a frozen server cannot
    hold its connect or its LISTEN."""

    def __init__(
        self,
        dsn: str,
        wake: asyncio.Event,
        bounds: DriverBounds | None = None,
        *,
        also: dict[str, asyncio.Event] | None = None,
    ) -> None:
        self.dsn = dsn
        self.wake = wake
        self.also = also or {}  # more channels, and whom each wakes (the indexer)
        self.bounds: DriverBounds = bounds or {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            connection: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                connection = await asyncpg.connect(self.dsn, **self.bounds)
                lost = asyncio.Event()
                connection.add_termination_listener(_setter(lost))
                await connection.add_listener(CHANNEL, self._notified)
                for channel, event in self.also.items():
                    await connection.add_listener(channel, _setter(event))
                # Jobs (and text to index) may have come while not listening.
                self._notified()
                for event in self.also.values():
                    event.set()
                await _wait_any(stop, lost, None)
                if lost.is_set() and not stop.is_set():
                    log.warning("compaction listener: connection lost; reconnecting")
                    await _sleep_or(stop, 1.0)
            except Exception as exc:  # any failure: poll meanwhile, never stop listening
                log.warning("compaction listener: %r; polling until it reconnects", exc)
                await _sleep_or(stop, 2.0)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close(timeout=2)

    def _notified(self, *_: Any) -> None:
        self.wake.set()


def listen_dsn(engine: AsyncEngine) -> str:
    """Where to LISTEN, as a plain libpq DSN for asyncpg.connect: the direct URL when the
    engine's goes through a transaction pooler (see ``listen_url``)."""
    return listen_url(engine)


class Background(Protocol):
    """A loop that runs beside the workers, woken by a ``NOTIFY`` on ``channel``."""

    channel: str
    wake: asyncio.Event

    async def run(self, stop: asyncio.Event) -> None: ...


class WorkerPool:
    """``count`` workers and a listener in this process, stopped gracefully."""

    def __init__(
        self,
        engine: AsyncEngine,
        config: WorkerConfig,
        outbound: Outbound | None,
        *,
        count: int,
        grace_seconds: float,
        wake: asyncio.Event | None = None,
        extras: Sequence[Background] = (),
    ) -> None:
        self.wake = wake or asyncio.Event()
        self.stop = asyncio.Event()
        self.grace_seconds = grace_seconds
        self.workers = [
            Worker(engine, config, outbound, name=worker_name(i), wake=self.wake)
            for i in range(count)
        ]
        # Beside the workers: the search indexer, and what the caller adds (the
        # webhook dispatcher), each woken by its own channel.
        self.background: list[Background] = [
            Indexer(engine, asyncio.Event(), config.poll_seconds),
            *extras,
        ]
        self.listener = Listener(
            listen_dsn(engine),
            self.wake,
            driver_bounds(engine),
            also={b.channel: b.wake for b in self.background},
        )
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self.workers:
            return
        self.tasks = [asyncio.create_task(w.run(self.stop)) for w in self.workers]
        self.tasks += [asyncio.create_task(b.run(self.stop)) for b in self.background]
        self.tasks.append(asyncio.create_task(self.listener.run(self.stop)))

    async def close(self) -> None:
        """Stop claiming; let jobs in hand finish for up to the grace period, then
        leave them to their lease."""
        self.stop.set()
        if not self.tasks:
            return
        _, pending = await asyncio.wait(self.tasks, timeout=self.grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
