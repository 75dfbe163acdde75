"""Running the relief policy (:mod:`app.engine.accounting.relief`) in a session's unit of work.

Every path that can raise the verdict calls :func:`relieve` with the session
locked: an append, a usage report, a provider's overflow error. It prunes when
the policy says so, then asks again with the verdict after the prune, and
compacts (on the spot, or a queued job) when the policy says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.budget.prune import prune_locked
from app.budget.schemas import PruneResult
from app.compactions import pivot
from app.compactions.schemas import CompactionStarted
from app.engine.accounting import relief
from app.engine.accounting.budget import Action, Verdict
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig
from app.store.session_row import SessionState, Unit


def guards_of(state: SessionState, config: SessionConfig) -> relief.Guards:
    """What the relief policy reads of a session besides its verdict."""
    return relief.Guards(
        prune_auto=config.prune.enabled and config.prune.auto,
        prune_minimum_tokens=config.prune.minimum_tokens,
        context_tool_tokens=state.context_tool_tokens,
        prune_checked_tool_tokens=state.prune_checked_tool_tokens,
        prune_checked_urgent=state.prune_checked_urgent,
        compaction_auto=config.compaction.enabled and config.compaction.auto,
        compaction_held_seq=state.compaction_held_seq,
        next_seq=state.next_seq,
        compaction_active=state.active_compaction_id is not None,
        compaction_failures=state.compaction_failures,
    )


def relief_wanted(
    trigger: relief.Trigger, action: Action, state: SessionState, config: SessionConfig
) -> bool:
    """Whether the verdict ``action`` asks for relief now (an append that needs
    it takes the session's row lock first)."""
    return relief.wanted(trigger, action, guards_of(state, config))


@dataclass(slots=True)
class Relieved:
    pruned: PruneResult | None
    compaction: CompactionStarted | None
    verdict: Verdict  # the session's, after the relief


async def relieve(
    unit: Unit,
    config: SessionConfig,
    trigger: relief.Trigger,
    *,
    now: datetime,
    verdict: Verdict | None = None,
    may_compact: bool = True,
) -> Relieved:
    """Prune, then compact, as the policy asks, in ``unit`` (the session locked).

    ``verdict``: the session's now, when the caller has it. ``may_compact``
    False: a compaction was queued since the context the report is about was
    served, so that model call has its compaction already. The verdict is
    computed again only after a step that changed the totals.
    """
    state = unit.state
    pruned = None
    if verdict is None:
        verdict = sessions.verdict_of(state, config)
    step = relief.prune_step(trigger, verdict.action, guards_of(state, config))
    if step is not None:
        pruned = await prune_locked(
            unit,
            config,
            minimum_tokens=step.minimum_tokens,
            urgent=step.urgent,
            trigger="overflow" if trigger == "overflow" else "auto",
        )
        if pruned.tokens_saved and not pruned.dry_run:
            verdict = sessions.verdict_of(state, config)
    compaction = None
    reason = relief.compaction_step(trigger, verdict.action, guards_of(state, config))
    if reason is not None and may_compact:
        if reason == "emergency":
            compaction = await pivot.compact_now(unit, config, now=now)
            verdict = sessions.verdict_of(state, config)
        else:
            compaction = await pivot.enqueue_locked(unit, config, reason=reason, auto=True)
    return Relieved(pruned, compaction, verdict)
