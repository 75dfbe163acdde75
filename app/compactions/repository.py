"""The compaction job queue: the ``compaction`` table's SQL and nothing else.

On a bare asyncpg connection (:class:`~app.core.driver.Driver`). The claim and
the heartbeat are single statements outside any transaction; the rest runs in
the caller's unit of work (:mod:`app.store.session_row`), so the job, the log
and the session's totals move together.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import orjson

from app.core.driver import Driver, Record, record_of
from app.engine import tree
from app.store import events

CHANNEL = "compactd_compactions"


@dataclass(slots=True)
class JobRow:
    """A ``compaction`` row as the service and the worker read it."""

    session_id: str
    tenant_id: str
    id: uuid.UUID
    status: str
    reason: str
    auto: bool
    strategy: str
    summarizer: str
    summarizer_used: str | None
    model: str | None
    instructions: str | None
    attempts: int
    run_after: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    tokens_before: int | None
    tokens_after: int | None
    summary: str | None
    short_summary: str | None
    source_start_seq: int | None
    first_kept_seq: int | None
    entry_seq: int | None
    details: dict[str, Any] | None
    error: str | None
    upstream_model: str | None
    upstream_usage: dict[str, Any] | None
    summarizer_calls: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


_COLUMNS = ", ".join(f"c.{f.name}" for f in fields(JobRow))


def _job(row: Record) -> JobRow:
    job = record_of(JobRow, row)
    if isinstance(job.details, str):
        job.details = orjson.loads(job.details)
    if isinstance(job.upstream_usage, str):
        job.upstream_usage = orjson.loads(job.upstream_usage)
    return job


_ENQUEUE_BRANCH_SQL = f"""
INSERT INTO compaction AS c (session_id, tenant_id, id, status, reason, auto, strategy,
    summarizer, model, instructions, attempts, run_after, created_at, details)
VALUES ($1, $2, $3, 'queued', 'branch_summary', false, 'structured', 'llm', NULL, $4, 0, now(),
    now(), $5::jsonb)
ON CONFLICT (session_id, tenant_id) WHERE status IN ('queued', 'running') DO NOTHING
RETURNING {_COLUMNS}
"""

# Insert a job unless the session already has one queued or running (the
# partial unique key); either way the active job comes back. The claim compares
# run_after with the database's clock, so the database's clock sets it.
_ENQUEUE_SQL = f"""
INSERT INTO compaction AS c (session_id, tenant_id, id, status, reason, auto, strategy,
    summarizer, model, instructions, attempts, run_after, created_at)
VALUES ($1, $2, $3, 'queued', $4, $5, $6, $7, $8, $9, 0, now(), now())
ON CONFLICT (session_id, tenant_id) WHERE status IN ('queued', 'running') DO NOTHING
RETURNING {_COLUMNS}
"""

# Transactional: workers (in every process) wake when the enqueue commits.
_NOTIFY_SQL = f"SELECT pg_notify('{CHANNEL}', '')"

# A job in hand when its worker shuts down goes back to the queue at once,
# without using up a claim (instead of waiting out its lease).
_RELEASE_SQL = """
UPDATE compaction SET status = 'queued', run_after = now(), lease_owner = NULL,
    lease_expires_at = NULL, attempts = attempts - 1
WHERE session_id = $1 AND tenant_id = $2 AND id = $3 AND status = 'running'
    AND lease_owner = $4 AND attempts = $5
"""

_ACTIVE_SQL = f"""
SELECT {_COLUMNS} FROM compaction AS c
WHERE c.session_id = $1 AND c.tenant_id = $2 AND c.status IN ('queued', 'running')
"""

_TO_OVERFLOW_SQL = """
UPDATE compaction SET reason = 'overflow'
WHERE session_id = $1 AND tenant_id = $2 AND status = 'queued' AND reason = 'threshold'
"""

# One short statement: the oldest due job, or a running one whose lease ended
# (its worker died). attempts is the fencing token: only the claim that set it
# may heartbeat or commit.
_CLAIM_SQL = f"""
UPDATE compaction AS c SET status = 'running', attempts = c.attempts + 1,
    lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
    started_at = coalesce(c.started_at, now())
FROM (
    SELECT session_id, tenant_id, id FROM compaction
    WHERE (status = 'queued' AND run_after <= now())
        OR (status = 'running' AND lease_expires_at < now())
    ORDER BY run_after
    LIMIT 1
    FOR UPDATE SKIP LOCKED
) AS due
WHERE c.session_id = due.session_id AND c.tenant_id = due.tenant_id AND c.id = due.id
RETURNING {_COLUMNS}
"""

_HEARTBEAT_SQL = """
UPDATE compaction SET lease_expires_at = now() + make_interval(secs => $6)
WHERE session_id = $1 AND tenant_id = $2 AND id = $3 AND status = 'running'
    AND lease_owner = $4 AND attempts = $5
RETURNING cancel_requested
"""

_LOCK_JOB_SQL = f"""
SELECT {_COLUMNS} FROM compaction AS c
WHERE c.session_id = $1 AND c.tenant_id = $2 AND c.id = $3
FOR UPDATE
"""

_GET_SQL = f"""
SELECT {_COLUMNS} FROM compaction AS c
WHERE c.session_id = $1 AND c.tenant_id = $2 AND c.id = $3
"""

_LIST_SQL = f"""
SELECT {_COLUMNS} FROM compaction AS c
WHERE c.session_id = $1 AND c.tenant_id = $2
    AND ($3::timestamptz IS NULL OR (c.created_at, c.id) < ($3, $4))
ORDER BY c.created_at DESC, c.id DESC
LIMIT $5
"""

# The compaction that wrote the summary entry at $3 on branch $4 (maybe another
# session's of the family: the one a fork was made from).
_PREVIOUS_SQL = """
SELECT c.summary, c.details FROM entry AS e
JOIN compaction AS c ON c.session_id = e.job_session_id AND c.tenant_id = e.tenant_id
    AND c.id = e.job_id
WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.seq = $3 AND e.branch = $4
    AND c.status = 'succeeded'
"""

# The reason also goes into details.notes, so a job that succeeds on a later
# attempt still records why the earlier ones failed.
_RETRY_SQL = """
UPDATE compaction SET status = 'queued', run_after = now() + make_interval(secs => $4),
    lease_owner = NULL, lease_expires_at = NULL, error = $5,
    details = jsonb_set(coalesce(details, '{}'::jsonb), '{notes}',
        coalesce(details->'notes', '[]'::jsonb) || to_jsonb('attempt ' || attempts || ': ' || $5))
        || coalesce(jsonb_build_object('retried_spend', $6::jsonb), '{}'::jsonb)
WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""

_FINISH_SQL = """
UPDATE compaction SET status = $4, error = $5, finished_at = now(), lease_owner = NULL,
    lease_expires_at = NULL, details = coalesce($6::jsonb, details)
WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""

_CANCEL_QUEUED_SQL = f"""
UPDATE compaction AS c SET status = 'cancelled', finished_at = now(), cancel_requested = true,
    error = 'cancelled before it ran'
WHERE c.session_id = $1 AND c.tenant_id = $2 AND c.id = $3 AND c.status = 'queued'
RETURNING {_COLUMNS}
"""

_REQUEST_CANCEL_SQL = f"""
UPDATE compaction AS c SET cancel_requested = true
WHERE c.session_id = $1 AND c.tenant_id = $2 AND c.id = $3 AND c.status = 'running'
RETURNING {_COLUMNS}
"""

_SUCCEED_SQL = """
UPDATE compaction SET status = 'succeeded', summary = $4, short_summary = $5,
    summarizer_used = $6, source_start_seq = $7, first_kept_seq = $8, entry_seq = $9,
    tokens_before = $10, tokens_after = $11, details = $12::jsonb, upstream_model = $13,
    upstream_usage = $14::jsonb, error = $15, finished_at = now(), lease_owner = NULL,
    lease_expires_at = NULL
WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""

_CALLS_SQL = """
UPDATE compaction SET summarizer_calls = $4 WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""

# A compaction made on the spot (the emergency path): born succeeded.
_INSERT_DONE_SQL = """
INSERT INTO compaction (session_id, tenant_id, id, status, reason, auto, strategy, summarizer,
    attempts, run_after, created_at, started_at, finished_at, summary, short_summary,
    summarizer_used, source_start_seq, first_kept_seq, entry_seq, tokens_before, tokens_after,
    details, upstream_model, upstream_usage, error)
VALUES ($1, $2, $3, 'succeeded', $4, true, 'structured', 'extractive', 1, $5, $5, $5, $5,
    $6, $7, $8, $9, $10, $11, $12, $13, $14::jsonb, $15, $16::jsonb, $17)
"""


@dataclass(slots=True)
class Outcome:
    """What a succeeded compaction records on its job, in the order of the
    columns _SUCCEED_SQL and _INSERT_DONE_SQL write."""

    summary: str
    short_summary: str | None
    summarizer_used: str
    source_start_seq: int
    first_kept_seq: int
    entry_seq: int
    tokens_before: int
    tokens_after: int
    details: dict[str, Any]
    upstream_model: str | None = None
    upstream_usage: dict[str, Any] | None = None
    error: str | None = None

    def values(self) -> tuple[Any, ...]:
        usage = None if self.upstream_usage is None else orjson.dumps(self.upstream_usage).decode()
        return (
            self.summary,
            self.short_summary,
            self.summarizer_used,
            self.source_start_seq,
            self.first_kept_seq,
            self.entry_seq,
            self.tokens_before,
            self.tokens_after,
            orjson.dumps(self.details).decode(),
            self.upstream_model,
            usage,
            self.error,
        )


class CompactionRepository:
    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    async def enqueue(
        self,
        driver: Driver,
        session_id: str,
        *,
        reason: str,
        auto: bool,
        strategy: str,
        summarizer: str,
        model: str | None,
        instructions: str | None,
        context_tokens: int | None = None,
    ) -> tuple[JobRow, bool]:
        """The session's active job and whether it is new; a new one becomes the
        session's ``active_compaction_id``. Runs in the caller's transaction.
        ``context_tokens``: the session's now, for the event."""
        row = await driver.fetchrow(
            _ENQUEUE_SQL,
            session_id,
            self.tenant_id,
            uuid.uuid4(),
            reason,
            auto,
            strategy,
            summarizer,
            model,
            instructions,
        )
        if row is not None:
            job = _job(row)
            await driver.execute(_NOTIFY_SQL)
            await _emit(driver, job, "compaction.queued", tokens_before=context_tokens)
            return job, True
        if reason == "overflow":
            # The provider refused a prompt: a job still waiting plans with the
            # overflow's smaller keep when it runs.
            await driver.execute(_TO_OVERFLOW_SQL, session_id, self.tenant_id)
        active = await driver.fetchrow(_ACTIVE_SQL, session_id, self.tenant_id)
        if active is None:  # pragma: no cover - the key said one exists, under the lock
            raise RuntimeError("no active compaction after a conflict")
        return _job(active), False

    async def enqueue_branch(
        self,
        driver: Driver,
        session_id: str,
        *,
        instructions: str | None,
        details: dict[str, Any],
        context_tokens: int | None = None,
    ) -> tuple[JobRow, bool]:
        """A branch-summary job (reason ``branch_summary``): ``details.navigation``
        says which branch it summarizes and where the leaf goes once it is written.
        The session has no active job (the caller cancelled it): this one is new."""
        row = await driver.fetchrow(
            _ENQUEUE_BRANCH_SQL,
            session_id,
            self.tenant_id,
            uuid.uuid4(),
            instructions,
            orjson.dumps(details).decode(),
        )
        if row is None:
            raise RuntimeError("a compaction is still active")
        await driver.execute(_NOTIFY_SQL)
        job = _job(row)
        await _emit(driver, job, "compaction.queued", tokens_before=context_tokens)
        return job, True

    async def release(self, driver: Driver, job: JobRow) -> None:
        await driver.execute(
            _RELEASE_SQL, job.session_id, job.tenant_id, job.id, job.lease_owner, job.attempts
        )

    @staticmethod
    async def claim(driver: Driver, owner: str, lease_seconds: float) -> JobRow | None:
        """The next due job of any tenant, leased to ``owner``: the queue is shared."""
        async with driver.transaction():
            row = await driver.fetchrow(_CLAIM_SQL, owner, lease_seconds)
            if row is None:
                return None
            job = _job(row)
            await _emit(driver, job, "compaction.started", attempt=job.attempts, worker=owner)
        return job

    async def heartbeat(self, driver: Driver, job: JobRow, lease_seconds: float) -> bool | None:
        """Extend the lease; whether a cancel was asked. None: the lease is lost."""
        value: bool | None = await driver.fetchval(
            _HEARTBEAT_SQL,
            job.session_id,
            job.tenant_id,
            job.id,
            job.lease_owner,
            job.attempts,
            lease_seconds,
        )
        return value

    async def lock_job(self, driver: Driver, session_id: str, job_id: uuid.UUID) -> JobRow | None:
        row = await driver.fetchrow(_LOCK_JOB_SQL, session_id, self.tenant_id, job_id)
        return None if row is None else _job(row)

    async def get(self, driver: Driver, session_id: str, job_id: uuid.UUID) -> JobRow | None:
        row = await driver.fetchrow(_GET_SQL, session_id, self.tenant_id, job_id)
        return None if row is None else _job(row)

    async def page(
        self,
        driver: Driver,
        session_id: str,
        *,
        limit: int,
        before: tuple[datetime, uuid.UUID] | None,
    ) -> list[JobRow]:
        created, job_id = before if before is not None else (None, None)
        rows = await driver.fetch(_LIST_SQL, session_id, self.tenant_id, created, job_id, limit)
        return [_job(r) for r in rows]

    async def previous(
        self, driver: Driver, family_id: str, path: tree.Path, summary_seq: int | None
    ) -> tuple[str, dict[str, Any] | None] | None:
        """The summary and details of the compaction whose entry is the path's
        ``summary_seq``."""
        if summary_seq is None:
            return None
        row = await driver.fetchrow(
            _PREVIOUS_SQL, family_id, self.tenant_id, summary_seq, path.branch_of(summary_seq)
        )
        if row is None or row["summary"] is None:
            return None
        details = row["details"]
        if isinstance(details, str):
            details = orjson.loads(details)
        return row["summary"], details

    async def retry_later(
        self,
        driver: Driver,
        job: JobRow,
        delay_seconds: float,
        error: str,
        spent: dict[str, int] | None = None,
    ) -> None:
        """Back to the queue after ``delay_seconds``, the error noted. ``spent``: what
        the summarizer requests of this job's attempts so far cost (their usage summed,
        and ``calls``), kept in its details until the attempt that commits counts it."""
        await driver.execute(
            _RETRY_SQL,
            job.session_id,
            job.tenant_id,
            job.id,
            delay_seconds,
            error,
            None if spent is None else orjson.dumps(spent).decode(),
        )
        await _emit(
            driver,
            job,
            "compaction.retrying",
            attempt=job.attempts,
            retry_in_seconds=round(delay_seconds, 1),
            error=error,
        )

    async def finish(
        self,
        driver: Driver,
        job: JobRow,
        status: str,
        error: str | None,
        details: dict[str, Any] | None = None,
    ) -> None:
        await driver.execute(
            _FINISH_SQL,
            job.session_id,
            job.tenant_id,
            job.id,
            status,
            error,
            None if details is None else orjson.dumps(details).decode(),
        )
        await _emit(driver, job, f"compaction.{status}", error=error)

    async def record_calls(
        self, driver: Driver, session_id: str, job_id: uuid.UUID, calls: int
    ) -> None:
        """The requests the job sent to its summarizer, in the caller's transaction."""
        await driver.execute(_CALLS_SQL, session_id, self.tenant_id, job_id, calls)

    async def cancel(self, driver: Driver, session_id: str, job_id: uuid.UUID) -> JobRow | None:
        """Cancel a queued job at once, or ask a running one to stop. None when
        it is neither (finished already)."""
        row = await driver.fetchrow(_CANCEL_QUEUED_SQL, session_id, self.tenant_id, job_id)
        if row is not None:
            job = _job(row)
            await _emit(driver, job, "compaction.cancelled", error=job.error)
            return job
        row = await driver.fetchrow(_REQUEST_CANCEL_SQL, session_id, self.tenant_id, job_id)
        return None if row is None else _job(row)

    async def succeed(self, driver: Driver, job: JobRow, done: Outcome) -> None:
        await driver.execute(_SUCCEED_SQL, job.session_id, self.tenant_id, job.id, *done.values())
        await _emit(driver, job, "compaction.succeeded", **_succeeded(done))

    async def insert_done(
        self,
        driver: Driver,
        session_id: str,
        job_id: uuid.UUID,
        done: Outcome,
        *,
        reason: str,
        now: datetime,
    ) -> None:
        """A compaction made on the spot, recorded as succeeded."""
        await driver.execute(
            _INSERT_DONE_SQL, session_id, self.tenant_id, job_id, reason, now, *done.values()
        )
        data = {"compaction_id": str(job_id), "reason": reason, "auto": True}
        await events.emit(
            driver, self.tenant_id, session_id, "compaction.succeeded", {**data, **_succeeded(done)}
        )


async def _emit(driver: Driver, job: JobRow, type_: str, **more: Any) -> None:
    """The job's event (app.store.events), in the caller's transaction."""
    data = {"compaction_id": str(job.id), "reason": job.reason, "auto": job.auto, **more}
    await events.emit(driver, job.tenant_id, job.session_id, type_, data)


def _succeeded(done: Outcome) -> dict[str, Any]:
    return {
        "tokens_before": done.tokens_before,
        "tokens_after": done.tokens_after,
        "summarizer": done.summarizer_used,
        "first_kept_seq": done.first_kept_seq,
        "entry_seq": done.entry_seq,
        "from_hook": bool(done.details.get("from_hook")),
        "error": done.error,
    }
