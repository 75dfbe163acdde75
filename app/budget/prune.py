"""Pruning: hiding old tool outputs behind a placeholder, in a session's unit of work.

The stored outputs stay as they are (unless ``prune.erase``): a prune adds a
mark per output, and the context shows the placeholder in its place.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import orjson

from app.budget.schemas import PruneRequest, PruneResult
from app.core import metrics
from app.engine.accounting import catalog, ledger, tokens
from app.engine.window import view
from app.engine.window.prune import PruneSettings, plan_prune
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig
from app.store import events
from app.store.log import ErasedRow, LogRepository, PrunedRow
from app.store.paths import OnPath
from app.store.session_row import Unit

# What the planner assumes a placeholder costs beyond its text: a typical call id.
# The totals use each placeholder's exact count.
_TYPICAL_CALL_ID_TOKENS = 8


async def prune_locked(
    unit: Unit,
    config: SessionConfig,
    *,
    dry_run: bool = False,
    request: PruneRequest | None = None,
    minimum_tokens: int | None = None,
    urgent: bool = False,
    trigger: str = "auto",
) -> PruneResult:
    """Plan and (unless ``dry_run``) apply a prune of the session's current view.

    Runs in the caller's unit of work (the session row locked); its state is
    updated to the totals after the prune and saved.

    ``urgent`` (the window is past the compaction threshold, or the provider
    refused the prompt): the last user turns are no longer protected as such,
    only the newest ``protect_tokens`` of tool output. An agent working on its
    own runs hundreds of tool calls inside one user turn; protecting that whole
    turn would leave compaction, which summarizes everything away, as the only
    relief, where hiding its oldest outputs is enough.
    """
    state, driver, session_id = unit.state, unit.driver, unit.session_id
    repo = LogRepository(unit.tenant_id)
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
    at = OnPath.of(session_id, state)
    items = await repo.window_items(driver, at, state.context_start_seq, state.next_seq)
    plan = plan_prune(items, settings)

    async def nothing(reason: str | None) -> PruneResult:
        """No prune; an automatic one looks again only when there is more to find."""
        if not dry_run:
            unit.apply(ledger.PruneChecked(urgent))
            await unit.save()
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
        now = datetime.now(UTC)
        await repo.mark_pruned(driver, at, rows, now, erased)
        unit.apply(ledger.Pruned(saved, urgent))
        await unit.save(now=now)
        await events.emit(
            driver,
            unit.tenant_id,
            session_id,
            "session.pruned",
            {
                "trigger": trigger,
                "tokens_saved": saved,
                "entries": len(rows),
                "erased": bool(erased),
                "context_tokens": state.context_tokens,
                "version": state.version,
            },
        )
        metrics.pruned(trigger, saved)
    return result(pruned, saved, plan.candidate_tokens, plan.protected_tokens, None)


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value
