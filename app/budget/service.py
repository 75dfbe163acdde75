"""Usage reports, pruning and provider errors: the model-free half of compaction.

Each use case is one short unit of work (:func:`app.store.session_row.locked`):
the session row locked first, so the running totals stay exact against
concurrent appends (which then read again, see ``app.messages.service``).
What relieves the window afterwards is :mod:`app.budget.relief`.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.budget.prune import prune_locked
from app.budget.relief import relieve
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
from app.core import metrics
from app.core.errors import invalid
from app.engine.accounting import budget, catalog, ledger, overflow_errors, tokens
from app.history.schemas import Format
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig
from app.store import events
from app.store.session_row import SessionState, locked


def verdict_model(state: SessionState, config: SessionConfig | None = None) -> Verdict:
    return Verdict.model_validate(dataclasses.asdict(sessions.verdict_of(state, config)))


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


def check_format(report: UsageReport, query_format: Format | None) -> None:
    """The ``?format=`` query parameter and the body's ``format``, when both are
    given, agree (as on an append)."""
    if query_format is not None and report.format is not None and report.format != query_format:
        raise invalid(
            "format",
            f"the query parameter format={query_format!r} and the body's format "
            f"{report.format!r} differ; give one, or the same in both",
        )


class BudgetService:
    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def usage(
        self, session_id: str, report: UsageReport, *, query_format: Format | None = None
    ) -> UsageResponse:
        """Calibrate against the provider's figures and give the new verdict.
        ``query_format``: the ``?format=`` the report came with, which must agree
        with its body's ``format`` when both are given."""
        check_format(report, query_format)
        now = datetime.now(UTC)
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                state = unit.state
                config = sessions.effective_config(state.config)
                was = sessions.verdict_of(state, config)
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
                usage_json = orjson.dumps(
                    {
                        **report.model_dump(exclude={"tools", "format"}),
                        "usage_format": report.usage_format,
                    }
                ).decode()
                stale = measured_before_pivot(state, measured, prompt, counted)
                if measured.served:
                    # This report measured the served context: the next one without
                    # context_version is about the next context served, or unknown.
                    state.served_version = None
                    state.served_context_tokens = None
                    state.served_compaction_id = None
                if stale:
                    # The agent's call went out before a compaction committed: its
                    # prompt is not this context's, so it teaches nothing.
                    unit.apply(ledger.StaleUsageReported(overhead))
                    await unit.save(now=now, last_usage=usage_json)
                    return UsageResponse(
                        usage_format=report.usage_format,
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
                # What was appended (or pruned) since the context was served is
                # the estimate's delta from this exact base.
                unit.apply(ledger.UsageReported(factor, overhead, prompt, measured.context_tokens))
                await unit.save(now=now, last_usage=usage_json)
                # (A compaction queued since the context was served is that model
                # call's: one call never gets two.)
                relieved = await relieve(
                    unit, config, "usage", now=now, may_compact=not measured.queued_since
                )
                await events.verdict_changed(
                    unit.driver, self.tenant_id, session_id, was, relieved.verdict, "usage"
                )
                overflow = Verdict.model_validate(dataclasses.asdict(relieved.verdict))
                return UsageResponse(
                    usage_format=report.usage_format,
                    calibration_factor=factor,
                    reported_prompt_tokens=prompt,
                    overhead_tokens=overhead,
                    version=state.version,
                    overflow=overflow,
                    pruned=relieved.pruned,
                    compaction=relieved.compaction,
                )

    async def prune(self, session_id: str, request: PruneRequest) -> PruneResult:
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                config = sessions.effective_config(unit.state.config)
                return await prune_locked(
                    unit,
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
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                state = unit.state
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
                    # The provider refused the prompt: prune whatever it saves, and
                    # summarize whatever the guards say.
                    relieved = await relieve(unit, config, "overflow", now=datetime.now(UTC))
                    pruned, compaction = relieved.pruned, relieved.compaction
                    action = (
                        "compact" if compaction else "prune" if pruned and pruned.pruned else "none"
                    )
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
