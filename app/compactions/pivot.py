"""Moving a session's pivot: the automatic triggers, preparing a compaction and
committing its summary. Shared by the append and usage paths (in their locked
transactions), the API and the worker.

Everything that moves the pivot runs in one transaction with the session row
locked: the compaction entry is appended to the log, the session's running
totals and pivot are set, and the job is finished, together or not at all.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import anyio.to_thread
import orjson

from app.compactions.repository import CompactionRepository, JobRow, Outcome
from app.compactions.schemas import CompactionRequest, CompactionStarted, Reason
from app.compactions.summarizer import Summarized, extractive
from app.core import metrics
from app.core.driver import Driver
from app.engine import tree
from app.engine.accounting import catalog
from app.engine.accounting.relief import FAILURE_LIMIT
from app.engine.accounting.summarizer_spend import Spend, hour_of
from app.engine.compaction import pivot_rules
from app.engine.compaction import prepare as compaction
from app.engine.compaction.pivot_rules import CONTINUE_TEXT as CONTINUE_TEXT
from app.engine.compaction.pivot_rules import CUT_OFF as CUT_OFF
from app.engine.compaction.pivot_rules import LOW_YIELD_SHARE as LOW_YIELD_SHARE
from app.engine.model import Entry, Role
from app.engine.search_text import search_text
from app.engine.window.view import render_view
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig
from app.store import spend as tenant_spend
from app.store.log import LogRepository, NewEntry, SourceRow
from app.store.paths import OnPath
from app.store.session_row import SessionState, Unit, add_compaction_cost

log = logging.getLogger("compactd.compaction")


def started(job: JobRow, created: bool) -> CompactionStarted:
    return CompactionStarted(
        id=job.id,
        status=job.status,
        reason=job.reason,
        created=created,
    )


# --- queuing ----------------------------------------------------------------


async def enqueue_locked(
    unit: Unit,
    config: SessionConfig,
    *,
    reason: Reason,
    auto: bool,
    request: CompactionRequest | None = None,
) -> CompactionStarted:
    """The session's active job, or a new one that becomes it, in ``unit``."""
    c = config.compaction
    ask = request or CompactionRequest()
    tenant_id, session_id = unit.tenant_id, unit.session_id
    job, created = await CompactionRepository(tenant_id).enqueue(
        unit.driver,
        session_id,
        reason=reason,
        auto=auto,
        strategy=ask.strategy or c.strategy,
        summarizer=ask.summarizer or c.summarizer,
        model=ask.model or c.model,
        instructions=_instructions(c.instructions, ask.instructions),
        context_tokens=unit.state.context_tokens,
    )
    unit.state.active_compaction_id = job.id
    await unit.save()
    if created:
        transition("queued", reason, job.id, session_id, tenant_id, auto=auto)
    return started(job, created)


def transition(
    status: str,
    reason: str,
    compaction_id: uuid.UUID,
    session_id: str,
    tenant_id: str,
    *,
    level: int = logging.INFO,
    count: bool = True,
    **fields: Any,
) -> None:
    """One log line, and one count in ``compactd_compaction_jobs``, per job transition
    (a success is counted by ``metrics.committed``, hence ``count``). Made inside a
    transaction (``metrics.after_commit``), both wait for it to commit."""
    if count:
        metrics.job(status, reason)
    extra = {
        "compaction_id": str(compaction_id),
        "session_id": session_id,
        "tenant": tenant_id,
        "status": status,
        "reason": reason,
        **{k: v for k, v in fields.items() if v is not None},
    }
    metrics.observe(lambda: log.log(level, f"compaction {status}", extra=extra))


def _instructions(configured: str | None, asked: str | None) -> str | None:
    parts = [p for p in (configured, asked) if p]
    return "\n\n".join(parts) or None


# --- preparing and committing -------------------------------------------------


def sources_of(rows: list[SourceRow], marks: dict[int, int]) -> list[compaction.Source]:
    """The entries since the pivot in the engine's terms; a pruned output costs
    its placeholder, as in the view; a pinned entry says so."""
    out = []
    for r in rows:
        entry = Entry(
            role=cast(Role, r.role),
            parts=r.parts,
            tool_call_id=r.tool_call_id,
            tool_name=r.tool_name,
            is_error=r.is_error,
            name=r.name,
            tokens=marks.get(r.seq, r.tokens),
        )
        out.append(
            compaction.Source(
                seq=r.seq,
                kind=r.kind,
                entry=entry,
                link_id=r.link_id,
                view_call_ids=tuple(r.call_ids or ()),
                pinned=r.pinned,
            )
        )
    return out


@dataclass(slots=True)
class Prepared:
    """A plan and what it was made against: the commit checks the pivot is unchanged."""

    plan: compaction.Plan
    previous_summary: str | None
    context_start_seq: int
    summary_seq: int | None
    path: tree.Path


async def prepare(
    driver: Driver,
    tenant_id: str,
    session_id: str,
    state: SessionState,
    config: SessionConfig,
    *,
    reason: str = "manual",
    light: bool = False,
) -> Prepared | None:
    """Read what the session holds since its pivot and plan the cut. None when
    there is nothing to compact. ``light`` reads no content: the plan then says
    where the cut falls, and holds nothing to summarize."""
    at = OnPath.of(session_id, state)
    rows, marks = await LogRepository(tenant_id).source(
        driver, at, state.context_start_seq, state.next_seq, light=light
    )
    previous = (
        None
        if light
        else await CompactionRepository(tenant_id).previous(
            driver, state.family_id, state.path, state.summary_seq
        )
    )
    window, _ = sessions.window_of(state)
    # What to keep and what the plan is made with: the engine's rules (shared
    # with bench/continuity.py's replay), the session's values. In a worker thread:
    # the plan reads every text since the pivot (its anchors, requests and file
    # operations), seconds of CPU for a history of megabytes, which on the event loop
    # would hold every other request (the emergency path runs inside an append).
    trigger = sessions.thresholds_of(config).trigger_tokens(window.usable_tokens)
    previous_details = previous[1] if previous else None
    plan = await anyio.to_thread.run_sync(
        functools.partial(
            pivot_rules.plan,
            sources_of(rows, marks),
            reason=reason,
            start_seq=state.context_start_seq,
            end_seq=state.next_seq,
            context_tokens=state.context_tokens,
            trigger_tokens=trigger,
            keep_recent_tokens=config.compaction.keep_recent_tokens,
            keep_requests_tokens=config.compaction.keep_requests_tokens,
            previous_details=previous_details,
            encoding=catalog.lookup(state.model).encoding,
        )
    )
    if plan is not None and not light:
        # The session's policy: under "verbatim_first" the plan's history becomes what
        # is left to summarize, and the plan carries the block kept as written.
        plan = await anyio.to_thread.run_sync(
            functools.partial(
                compaction.with_policy,
                plan,
                config.compaction.policy,
                verbatim_share=config.compaction.verbatim_share,
                usable_tokens=window.usable_tokens,
                trigger_tokens=trigger,
                previous_details=previous_details,
            )
        )
    if plan is None:
        return None
    return Prepared(
        plan=plan,
        previous_summary=pivot_rules.previous_summary(previous[0] if previous else None),
        context_start_seq=state.context_start_seq,
        summary_seq=state.summary_seq,
        path=state.path,
    )


def pivot_unchanged(state: SessionState, prepared: Prepared) -> bool:
    """The session still follows the path the plan was made on, from the same pivot
    (a navigation since moves the path; what it abandoned is not compacted)."""
    return (
        state.context_start_seq == prepared.context_start_seq
        and state.summary_seq == prepared.summary_seq
        and state.path == prepared.path  # appends leave it; a navigation moves it
    )


@dataclass(slots=True)
class Committed:
    entry_seq: int
    tokens_before: int
    tokens_after: int
    version: int
    continued: bool


@dataclass(slots=True)
class NoGain:
    """A summary that would not make the context smaller: not committed. The
    figures are counted tokens (the stored counts), before and after."""

    tokens_before: int
    tokens_after: int

    @property
    def reason(self) -> str:
        return (
            "not committed: with its summary the context would hold "
            f"{self.tokens_after} counted tokens, not fewer than the {self.tokens_before} it "
            "holds now (the summary is longer than the history it replaces); nothing changed"
        )


def stored_entry(new: pivot_rules.PivotEntry) -> NewEntry:
    """A compactd entry as the log stores it, its views rendered."""
    return _stored(new)


def _stored(new: pivot_rules.PivotEntry) -> NewEntry:
    entry = new.entry
    view_openai, view_anthropic = render_view(entry)
    return NewEntry(
        seq=new.seq,
        kind=new.kind,
        parts_json=orjson.dumps(entry.parts).decode(),
        tokens=entry.tokens,
        view_openai=view_openai,
        view_anthropic=view_anthropic,
        search_text=search_text(entry.parts),
    )


async def _should_continue(driver: Driver, repo: LogRepository, at: OnPath, seq: int) -> bool:
    """Whether a synthetic "continue" should follow an automatic compaction whose
    log ends at ``seq``: :func:`app.engine.compaction.pivot_rules.continues` on the log's tail
    (whether calls are pending is read for a tool result only)."""
    tail = await repo.tail(driver, at, seq)
    if tail is None:
        return False
    role, kind, calls, finish_reason = tail
    pending = kind == "message" and role == "tool" and await repo.calls_pending(driver, at, seq)
    return pivot_rules.continues(
        role=role, kind=kind, makes_calls=calls, finish_reason=finish_reason, calls_pending=pending
    )


async def commit_pivot(
    unit: Unit,
    config: SessionConfig,
    prepared: Prepared,
    summarized: Summarized,
    *,
    job_id: uuid.UUID,
    auto: bool,
    now: datetime,
) -> Committed | NoGain:
    """Append the compaction entry and move the session's pivot to it, in the
    caller's unit of work (the session row locked); its state is updated and saved.

    The entries, the move and whether it is committed are
    :mod:`app.engine.compaction.pivot_rules`' (shared with bench/continuity.py's replay).
    A summary that would leave the context no smaller is not committed
    (:class:`NoGain`): nothing is written (judged on counted tokens, see
    :func:`~app.engine.compaction.pivot_rules.judge`).
    """
    state, driver = unit.state, unit.driver
    at = OnPath.of(unit.session_id, state)
    repo = LogRepository(unit.tenant_id)
    plan = prepared.plan
    before = sessions.verdict_of(state, config).estimated_tokens
    seq = state.next_seq
    continued = (
        auto
        and config.compaction.auto_continue
        and await _should_continue(driver, repo, at, seq - 1)
    )
    new = pivot_rules.pivot_entries(
        seq,
        summarized.summary,
        continued=continued,
        encoding=catalog.lookup(state.model).encoding,
        # Its seq range, not its job's id: the replay (bench/continuity.py) writes the
        # same entry without a job.
        replaced=(plan.start_seq, plan.first_kept_seq - 1),
    )
    pinned = pivot_rules.pinned_after(state.pinned_seqs, plan)
    # The kept window's totals, read before the new entries exist (they are
    # user messages: they add to the context, never to its tool outputs).
    kept, tool_context = await repo.context_totals(
        driver, at, plan.first_kept_seq, list(pinned), seq
    )
    moved = pivot_rules.moved(
        plan, new, pinned, window_tokens=kept, window_tool_tokens=tool_context
    )
    judged = pivot_rules.judge(sessions.accounting_of(state), moved)
    if not judged.gain:
        return NoGain(judged.tokens_before, judged.tokens_after)
    path_tokens = state.stored_tokens
    for entry in new:
        stored = _stored(entry)
        path_tokens += stored.tokens
        summary = entry.kind == "compaction"
        await repo.insert_entry(
            driver,
            at,
            stored,
            now,
            path_tokens,
            job_id if summary else None,
            (plan.first_kept_seq, list(pinned)) if summary else None,
        )
    unit.apply(moved)
    # Low yield: hold automatic compaction until new history arrives.
    state.compaction_held_seq = state.next_seq if judged.low_yield else None
    if not auto or state.compaction_failures < FAILURE_LIMIT:
        state.compaction_failures = 0
    if state.active_compaction_id == job_id:
        state.active_compaction_id = None
    await unit.save()  # no now: updated_at is the database's clock, as it always was here
    return Committed(
        seq, before, sessions.verdict_of(state, config).estimated_tokens, state.version, continued
    )


def outcome(
    prepared: Prepared, summarized: Summarized, committed: Committed, *, error: str | None = None
) -> Outcome:
    """What the job records once its summary is committed."""
    return Outcome(
        summary=summarized.summary,
        short_summary=summarized.short_summary,
        summarizer_used=summarized.used,
        source_start_seq=prepared.plan.start_seq,
        first_kept_seq=prepared.plan.first_kept_seq,
        entry_seq=committed.entry_seq,
        tokens_before=committed.tokens_before,
        tokens_after=committed.tokens_after,
        details={
            **prepared.plan.details,
            # What the continuity gate found (the worker's path has it in the plan's
            # details already; the emergency path, compact_now, only here).
            **({"gate": summarized.gate.to_details()} if summarized.gate else {}),
            "notes": summarized.notes,
            "continued": committed.continued,
        },
        upstream_model=summarized.upstream_model,
        upstream_usage=summarized.usage or None,
        error=error,
    )


async def record_cost(
    unit: Unit,
    usage: Mapping[str, int] | None,
    *,
    calls: int = 0,
    job_id: uuid.UUID | None = None,
    saved_tokens: int,
    committed: bool,
    limited: bool = False,
    now: datetime,
) -> Spend:
    """Add what a compaction (or branch summary) cost, its ``calls`` summarizer
    requests and their ``usage`` summed (:class:`~app.engine.accounting.summarizer_spend.Spend`),
    and the context tokens it removed to the session's sums and the tenant's (its
    totals and the hour of ``now``), in ``unit``'s transaction: counted once, when it
    commits. ``job_id``: the job that records its calls. ``committed``: a compaction
    moved the pivot (counted in the tenant's ``compactions``); ``limited``: the spend
    limit made it extractive."""
    spend = Spend.of(usage, calls)
    saved = max(0, saved_tokens)
    if spend.empty and not saved and not committed and not limited:
        return spend
    if job_id is not None and calls:
        await CompactionRepository(unit.tenant_id).record_calls(
            unit.driver, unit.session_id, job_id, calls
        )
    await add_compaction_cost(
        unit.driver,
        unit.tenant_id,
        unit.session_id,
        calls=spend.calls,
        input_tokens=spend.input_tokens,
        output_tokens=spend.output_tokens,
        cached_tokens=spend.cached_tokens,
        saved_tokens=saved,
    )
    await tenant_spend.record(
        unit.driver,
        unit.tenant_id,
        hour_of(now),
        spend,
        compactions=int(committed),
        saved_tokens=saved,
        limited=limited,
    )
    return spend


async def compact_now(
    unit: Unit, config: SessionConfig, *, now: datetime
) -> CompactionStarted | None:
    """The emergency path: an extractive compaction, no model call, committed in
    the caller's transaction. None (and held until new history) when nothing
    can be summarized, or the summary would not make the context smaller."""
    started = time.perf_counter()
    state, tenant_id, session_id = unit.state, unit.tenant_id, unit.session_id
    repo = CompactionRepository(tenant_id)
    prepared = await prepare(unit.driver, tenant_id, session_id, state, config, reason="emergency")
    if prepared is None:
        state.compaction_held_seq = state.next_seq
        await unit.save()
        return None
    # A second of CPU for a large history: in a worker thread, off the event loop.
    # The session's standing instructions are its focus here too (the job's notes say so).
    summarized = await anyio.to_thread.run_sync(
        extractive, prepared.plan, prepared.previous_summary, config.compaction.instructions
    )
    job_id = uuid.uuid4()
    committed = await commit_pivot(
        unit,
        config,
        prepared,
        summarized,
        job_id=job_id,
        auto=True,
        now=now,
    )
    if isinstance(committed, NoGain):
        state.compaction_held_seq = state.next_seq
        await unit.save()
        return None
    await repo.insert_done(
        unit.driver,
        session_id,
        job_id,
        outcome(prepared, summarized, committed),
        reason="emergency",
        now=now,
    )
    await record_cost(
        unit,
        None,  # extractive: no summarizer call
        saved_tokens=committed.tokens_before - committed.tokens_after,
        committed=True,
        now=now,
    )
    seconds = time.perf_counter() - started
    metrics.committed(
        "emergency", "extractive", seconds, committed.tokens_before, committed.tokens_after
    )
    transition(
        "succeeded",
        "emergency",
        job_id,
        session_id,
        tenant_id,
        count=False,
        summarizer="extractive",
        tokens_before=committed.tokens_before,
        tokens_after=committed.tokens_after,
        duration_ms=round(seconds * 1000, 2),
    )
    return CompactionStarted(id=job_id, status="succeeded", reason="emergency", created=True)


async def cancel_active(unit: Unit, detail: str) -> bool:
    """Cancel the session's active compaction: a queued one at once (True), a running
    one asked to stop (it never commits: its plan was made on another path)."""
    state = unit.state
    if state.active_compaction_id is None:
        return True
    repo = CompactionRepository(unit.tenant_id)
    cancelled = await repo.cancel(unit.driver, unit.session_id, state.active_compaction_id)
    if cancelled is None or cancelled.status == "cancelled":
        if cancelled is not None:
            transition(
                "cancelled",
                cancelled.reason,
                cancelled.id,
                unit.session_id,
                unit.tenant_id,
                detail=detail,
            )
        state.active_compaction_id = None
        return True
    return False


async def enqueue_branch_summary(
    driver: Driver,
    tenant_id: str,
    session_id: str,
    instructions: str | None,
    details: dict[str, Any],
    context_tokens: int | None = None,
) -> JobRow:
    """A branch-summary job (app.tree.service): ``details.navigation`` says which
    branch it summarizes and where the leaf goes once the summary is written."""
    job, _ = await CompactionRepository(tenant_id).enqueue_branch(
        driver,
        session_id,
        instructions=instructions,
        details=details,
        context_tokens=context_tokens,
    )
    return job
