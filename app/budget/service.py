"""Usage reports, pruning and provider errors: the model-free half of compaction.

Each use case is one short transaction on a bare asyncpg connection that locks
the session row first, so the running totals stay exact against concurrent
appends (which then read again, see ``app.messages.service``).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.budget.repository import BudgetRepository, ErasedRow, PrunedRow
from app.budget.schemas import (
    ProviderError,
    ProviderErrorVerdict,
    PruneRequest,
    PruneResult,
    Recovery,
    UsageReport,
    UsageResponse,
    Verdict,
)
from app.compactions import pivot
from app.core import metrics
from app.core.database import driver_connection
from app.core.errors import NotFound
from app.engine import budget, catalog, overflow_errors, tokens, view
from app.engine.prune import PruneSettings, plan_prune
from app.sessions import service as sessions
from app.sessions.repository import SessionState, lock_state
from app.sessions.schemas import SessionConfig

# What the planner assumes a placeholder costs beyond its text: a typical call id.
# The totals use each placeholder's exact count.
_TYPICAL_CALL_ID_TOKENS = 8


def verdict_model(state: sessions.Budgeted, config: SessionConfig | None = None) -> Verdict:
    return Verdict.model_validate(dataclasses.asdict(sessions.verdict_of(state, config)))


async def locked_state(driver: Any, tenant_id: str, session_id: str) -> SessionState:
    state = await lock_state(driver, tenant_id, session_id)
    if state is None:
        raise NotFound(f"session {session_id!r} does not exist")
    return state


async def prune_locked(
    driver: Any,
    tenant_id: str,
    session_id: str,
    state: SessionState,
    config: SessionConfig,
    *,
    dry_run: bool = False,
    request: PruneRequest | None = None,
    minimum_tokens: int | None = None,
    urgent: bool = False,
    trigger: str = "auto",
) -> PruneResult:
    """Plan and (unless ``dry_run``) apply a prune of the session's current view.

    Runs in the caller's transaction with the session row locked; ``state`` is
    updated in place to the totals after the prune.

    ``urgent`` (the window is past the compaction threshold, or the provider
    refused the prompt): the last user turns are no longer protected as such,
    only the newest ``protect_tokens`` of tool output. An agent working on its
    own runs hundreds of tool calls inside one user turn; protecting that whole
    turn would leave compaction, which summarizes everything away, as the only
    relief, where hiding its oldest outputs is enough.
    """
    repo = BudgetRepository(tenant_id)
    cfg = config.prune

    def result(
        pruned: list[dict[str, Any]], saved: int, candidate: int, protected: int, reason: str | None
    ) -> PruneResult:
        # One validation pass over plain dicts: thousands of entries cost little.
        return PruneResult.model_validate(
            {
                "dry_run": dry_run,
                "pruned": pruned,
                "tokens_saved": saved,
                "candidate_tokens": candidate,
                "protected_tokens": protected,
                "reason": reason,
                "version": state.version,
                "overflow": dataclasses.asdict(sessions.verdict_of(state, config)),
            }
        )

    if not cfg.enabled:
        return result([], 0, 0, 0, "disabled")
    encoding = catalog.lookup(state.model).encoding
    base_placeholder = tokens.count_entry(
        view.placeholder_entry(None, None, False, cfg.placeholder), encoding
    )
    asked = request or PruneRequest()
    settings = PruneSettings(
        protect_tokens=_pick(asked.protect_tokens, cfg.protect_tokens),
        minimum_tokens=_pick(minimum_tokens, _pick(asked.minimum_tokens, cfg.minimum_tokens)),
        protect_turns=0 if urgent else _pick(asked.protect_turns, cfg.protect_turns),
        protected_tools=frozenset(t.lower() for t in cfg.protected_tools),
        placeholder_tokens=base_placeholder + _TYPICAL_CALL_ID_TOKENS,
    )
    items = await repo.window_items(driver, session_id, state.context_start_seq, state.next_seq)
    plan = plan_prune(items, settings)

    async def nothing(reason: str | None) -> PruneResult:
        """No prune; an automatic one looks again only when there is more to find."""
        if not dry_run:
            await repo.mark_checked(driver, session_id, urgent)
            state.prune_checked_tool_tokens = state.context_tool_tokens
            state.prune_checked_urgent = urgent
        return result([], 0, plan.candidate_tokens, plan.protected_tokens, reason)

    if not plan.seqs:
        return await nothing(plan.reason)

    by_seq = {item.seq: item for item in items}
    rows: list[PrunedRow] = []
    erased: list[ErasedRow] = []
    pruned: list[dict[str, Any]] = []
    placeholders = view.PlaceholderViews(cfg.placeholder)
    erased_parts = orjson.dumps([{"type": "text", "text": cfg.placeholder}]).decode()
    saved = 0
    for seq in plan.seqs:
        item = by_seq[seq]
        # count_entry of the placeholder entry, without building it: framing and
        # text are the same for every output, only the call id differs (counted
        # when the result was written).
        id_tokens = item.call_id_tokens
        if id_tokens is None:
            id_tokens = tokens.count_text(item.tool_call_id or "", encoding)
        cost = base_placeholder + id_tokens
        if item.tokens <= cost:
            continue  # a long call id on a short output: the placeholder saves nothing
        saved += item.tokens - cost
        pruned.append({"seq": seq, "tool_name": item.tool_name, "tokens": item.tokens})
        rows.append(PrunedRow(seq, cost))
        if cfg.erase:
            views = placeholders.render(item.tool_call_id, item.is_error)
            erased.append(ErasedRow(seq, erased_parts, *views))
    if not rows or saved < settings.minimum_tokens:
        # The planner's placeholder cost is an estimate; the exact one fell short.
        return await nothing("below_minimum")
    if not dry_run:
        state.version = await repo.mark_pruned(
            driver, session_id, rows, saved, datetime.now(UTC), erased, urgent
        )
        state.context_tokens -= saved
        state.context_tool_tokens -= saved
        state.prune_checked_tool_tokens = state.context_tool_tokens
        state.prune_checked_urgent = urgent
        metrics.pruned(trigger, saved)
    return result(pruned, saved, plan.candidate_tokens, plan.protected_tokens, None)


# Above this ratio of reported to counted, a report that came right after a
# compaction is taken to measure the context before it (when which context it
# measured is not known otherwise).
STALE_RATIO = 1.5


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """The context a usage report or a provider error is about.

    ``version`` is the context's version when known: the ``context_version``
    the agent sent, else the last context GET /context served that no report
    has measured yet (agents report after the call they made with it, often
    after appending its reply). ``context_tokens`` is what the session counted
    for that context. ``served``: it is the served context (a usage report
    consumes it). ``queued_since``: a compaction was queued after it was served
    (by the reply's append, say), so that model call already has its compaction.
    """

    version: int | None
    context_tokens: int
    served: bool
    queued_since: bool


def measured_context(state: SessionState, context_version: int | None) -> Measured:
    served = state.served_version is not None and context_version in (None, state.served_version)
    if not served:
        return Measured(context_version, state.context_tokens, False, False)
    queued_since = (
        state.active_compaction_id is not None
        and state.active_compaction_id != state.served_compaction_id
    )
    tokens = state.served_context_tokens
    return Measured(
        state.served_version,
        state.context_tokens if tokens is None else tokens,
        True,
        queued_since,
    )


def measured_before_pivot(
    state: SessionState, measured: Measured, prompt: int | None, counted: int
) -> bool:
    """Whether a usage report or a provider error is about a context that a
    compaction has replaced since the agent read it.

    With the context's version (sent by the agent, or the context last served)
    this is exact. Without it: the first report after a compaction whose
    prompt is far larger than the context now counted is taken as stale.
    """
    if state.pivot_version is None:
        return False
    if measured.version is not None:
        return measured.version < state.pivot_version
    return (
        state.reported_prompt_tokens is None
        and prompt is not None
        and prompt > STALE_RATIO * counted
    )


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value


def wants_auto_prune(state: SessionState, config: SessionConfig, action: budget.Action) -> bool:
    """After an append or a usage report: does its verdict (``action``) ask for a prune now?"""
    if not (config.prune.enabled and config.prune.auto):
        return False
    return budget.should_auto_prune(
        action,
        state.context_tool_tokens,
        state.prune_checked_tool_tokens,
        state.prune_checked_urgent,
        config.prune.minimum_tokens,
    )


async def auto_prune(
    driver: Any,
    tenant_id: str,
    session_id: str,
    state: SessionState,
    config: SessionConfig,
    action: budget.Action,
) -> PruneResult:
    """The prune an append or usage report starts, its verdict being ``action``."""
    urgent = budget.urgent(action)
    return await prune_locked(driver, tenant_id, session_id, state, config, urgent=urgent)


class BudgetService:
    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id
        self.repo = BudgetRepository(tenant_id)

    async def usage(self, session_id: str, report: UsageReport) -> UsageResponse:
        """Calibrate against the provider's figures and give the new verdict."""
        now = datetime.now(UTC)
        with metrics.after_commit():
            async with driver_connection(self.engine) as driver, driver.transaction():
                state = await locked_state(driver, self.tenant_id, session_id)
                config = sessions.effective_config(state.config)
                encoding = catalog.lookup(state.model).encoding
                if report.tools_tokens is not None:
                    overhead = report.tools_tokens
                elif report.tools is not None:
                    overhead = tokens.count_tools(report.tools, encoding)
                else:
                    overhead = state.overhead_tokens
                prompt = report.input_tokens + report.cache_read_tokens + report.cache_write_tokens
                measured = measured_context(state, report.context_version)
                # The prompt just measured is the context the call sent, plus what each
                # request adds: compare like with like, uncalibrated.
                counted = measured.context_tokens + overhead + tokens.REPLY_PRIMING_TOKENS
                usage_json = report.model_dump_json(exclude={"tools"})
                if measured_before_pivot(state, measured, prompt, counted):
                    # The agent's call went out before a compaction committed: its
                    # prompt is not this context's, so it teaches nothing.
                    state.version = await self.repo.record_stale_usage(
                        driver,
                        session_id,
                        overhead_tokens=overhead,
                        usage_json=usage_json,
                        now=now,
                        consumed=measured.served,
                    )
                    state.overhead_tokens = overhead
                    return UsageResponse(
                        calibration_factor=state.calibration_factor,
                        reported_prompt_tokens=state.reported_prompt_tokens,
                        overhead_tokens=overhead,
                        version=state.version,
                        overflow=verdict_model(state, config),
                        pruned=None,
                        compaction=None,
                        stale=True,
                    )
                factor = budget.calibrate(state.calibration_factor, prompt, counted)
                state.version = await self.repo.record_usage(
                    driver,
                    session_id,
                    calibration_factor=factor,
                    overhead_tokens=overhead,
                    reported_prompt_tokens=prompt,
                    context_tokens_at_report=measured.context_tokens,
                    usage_json=usage_json,
                    now=now,
                    consumed=measured.served,
                )
                state.calibration_factor = factor
                state.overhead_tokens = overhead
                state.reported_prompt_tokens = prompt
                # What was appended (or pruned) since the context was served is
                # the estimate's delta from this exact base.
                state.context_tokens_at_report = measured.context_tokens
                pruned = None
                action = sessions.verdict_of(state, config).action
                if wants_auto_prune(state, config, action):
                    pruned = await auto_prune(
                        driver, self.tenant_id, session_id, state, config, action
                    )
                compaction = None
                reason = pivot.auto_reason(state, config, sessions.verdict_of(state, config).action)
                if reason is not None and not measured.queued_since:
                    # (A compaction queued since the context was served is that model
                    # call's: one call never gets two.)
                    compaction = await pivot.start_auto(
                        driver, self.tenant_id, session_id, state, config, reason, now=now
                    )
                return UsageResponse(
                    calibration_factor=factor,
                    reported_prompt_tokens=prompt,
                    overhead_tokens=overhead,
                    version=state.version,
                    overflow=verdict_model(state, config),
                    pruned=pruned,
                    compaction=compaction,
                )

    async def prune(self, session_id: str, request: PruneRequest) -> PruneResult:
        with metrics.after_commit():
            async with driver_connection(self.engine) as driver, driver.transaction():
                state = await locked_state(driver, self.tenant_id, session_id)
                config = sessions.effective_config(state.config)
                return await prune_locked(
                    driver,
                    self.tenant_id,
                    session_id,
                    state,
                    config,
                    dry_run=request.dry_run,
                    request=request,
                    trigger="manual",
                )

    async def provider_error(self, session_id: str, error: ProviderError) -> ProviderErrorVerdict:
        """Is it a context overflow? If so, relieve the window now (prune, with no
        minimum: any saving helps the retry) and give the verdict."""
        match = overflow_errors.classify(error.status, error.message)
        with metrics.after_commit():
            async with driver_connection(self.engine) as driver, driver.transaction():
                state = await locked_state(driver, self.tenant_id, session_id)
                recovery = None
                measured = measured_context(state, error.context_version)
                counted = (
                    measured.context_tokens + state.overhead_tokens + tokens.REPLY_PRIMING_TOKENS
                )
                stale = match.overflow and measured_before_pivot(
                    state, measured, match.requested_tokens, counted
                )
                if stale:
                    # The refused prompt was the context before a compaction that has
                    # committed since: the agent's next read already fits better.
                    recovery = Recovery(action="none", pruned=None, compaction=None, stale=True)
                elif match.overflow:
                    config = sessions.effective_config(state.config)
                    pruned = await prune_locked(
                        driver,
                        self.tenant_id,
                        session_id,
                        state,
                        config,
                        minimum_tokens=0,
                        urgent=True,
                        trigger="overflow",
                    )
                    compaction = None
                    if config.compaction.enabled and config.compaction.auto:
                        # The provider refused the prompt: summarize, whatever the guards say.
                        compaction = await pivot.enqueue_locked(
                            driver,
                            self.tenant_id,
                            session_id,
                            state,
                            config,
                            reason="overflow",
                            auto=True,
                        )
                    action = "compact" if compaction else "prune" if pruned.pruned else "none"
                    recovery = Recovery(action=action, pruned=pruned, compaction=compaction)
                return ProviderErrorVerdict(
                    overflow=match.overflow,
                    provider=match.provider,
                    pattern=match.pattern,
                    requested_tokens=match.requested_tokens,
                    limit_tokens=match.limit_tokens,
                    recovery=recovery,
                    verdict=verdict_model(state),
                )
