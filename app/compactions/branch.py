"""The branch-summary job's reads and its commit (a job of reason
``branch_summary``, queued by a navigation that asked for one: app.tree.service).

The worker summarizes the abandoned branch (app.engine.compaction.branch_summary plans it, the
compaction's summarizers write it) and then, in one transaction with the session
locked, moves the leaf to the navigation's target and appends the summary entry
after it. If the session moved meanwhile (an append, another navigation), the
navigation is called off: the job is cancelled and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.compactions.pivot import cancel_active, sources_of, stored_entry
from app.compactions.repository import CompactionRepository, JobRow, Outcome
from app.compactions.summarizer import Summarized
from app.core.driver import Driver
from app.engine.accounting import catalog, ledger
from app.engine.compaction import branch_summary, pivot_rules
from app.engine.compaction.prepare import Plan
from app.engine.tree import Path, Prefix
from app.sessions import service as sessions
from app.store import branches, events
from app.store.log import LogRepository
from app.store.paths import OnPath
from app.store.session_row import SessionState, Unit


@dataclass(frozen=True, slots=True)
class Navigation:
    """What the navigation recorded on its job (``details.navigation``)."""

    from_path: Path
    from_next_seq: int
    common_seq: int
    target_branch: int
    target_seq: int
    target: Prefix

    @classmethod
    def of(cls, job: JobRow) -> Navigation | None:
        raw = (job.details or {}).get("navigation")
        if not isinstance(raw, dict):
            return None
        return cls(
            Path(tuple(raw["from_branches"]), tuple(raw["from_ends"])),
            int(raw["from_next_seq"]),
            int(raw["common_seq"]),
            int(raw["target_branch"]),
            int(raw["target_seq"]),
            Prefix(tuple(raw["target_branches"]), tuple(raw["target_ends"])),
        )

    def details(self) -> dict[str, Any]:
        return {
            "from_branches": list(self.from_path.branches),
            "from_ends": list(self.from_path.ends),
            "from_next_seq": self.from_next_seq,
            "common_seq": self.common_seq,
            "target_branch": self.target_branch,
            "target_seq": self.target_seq,
            "target_branches": list(self.target.branches),
            "target_ends": list(self.target.ends),
        }


async def plan_branch(driver: Driver, job: JobRow, state: SessionState, nav: Navigation) -> Plan:
    """The plan of the summary of the branch the navigation leaves."""
    at = OnPath(job.session_id, state.family_id, nav.from_path)
    start, end = nav.common_seq + 1, nav.from_next_seq
    rows, marks = await LogRepository(job.tenant_id).source(driver, at, start, end)
    # The file operations go on from the latest summary on the path: a compaction's,
    # or an earlier branch summary's (cumulative across both: docs/how-it-works.md, "The tree").
    pivot = await branches.pivot_at(driver, job.tenant_id, at, end - 1)
    branch_summary_seq = await branches.last_branch_summary(driver, job.tenant_id, at, end - 1)
    latest = max(
        (s for s in (pivot.summary_seq, branch_summary_seq) if s is not None), default=None
    )
    previous = await CompactionRepository(job.tenant_id).previous(
        driver, state.family_id, nav.from_path, latest
    )
    config = sessions.effective_config(state.config)
    window, _ = sessions.window_of(state)
    budget = max(window.usable_tokens - config.branch_summary.reserve_tokens, 1_000)
    return branch_summary.plan(
        sources_of(rows, marks),
        budget_tokens=budget,
        previous_details=previous[1] if previous else None,
        encoding=catalog.lookup(state.model).encoding,
        start_seq=start,
        end_seq=end,
    )


async def move_leaf(
    unit: Unit,
    landing: branches.Landing,
    prefix: Prefix,
    *,
    same_as: SessionState | None = None,
) -> Path:
    """Make ``landing`` the session's leaf (in the caller's unit of work): the path
    goes on along the landing's branch when the session writes it and the landing is
    its tip, else along a new branch after the landing. The context is recounted
    from the new path's window, unless ``same_as`` is a session whose leaf the
    landing is (a fork at its leaf): then its totals are the new path's, as they
    are. An active compaction is cancelled (it was planned on the old path), and
    the proxy's record of the history is dropped (it is read again on the next
    proxied call)."""
    driver, tenant_id, state = unit.driver, unit.tenant_id, unit.state
    family = state.family_id
    if landing.placement is not None:  # read with the landing, in the caller's unit
        owner: tuple[str, Path] | None = (landing.placement.owner_id, landing.placement.path)
        tip: int | None = landing.placement.tip
    else:
        owner = await branches.branch_path(driver, tenant_id, family, landing.branch)
        tip = await branches.branch_tip(driver, tenant_id, family, landing.branch)
    if owner is not None and owner[0] == unit.session_id and tip == landing.seq:
        path = prefix.reopen()
    else:
        path = await branches.new_branch(driver, tenant_id, family, unit.session_id, prefix)
    if same_as is not None and same_as.next_seq == landing.seq + 1:
        moved = ledger.PathMoved(
            next_seq=same_as.next_seq,
            stored_tokens=same_as.stored_tokens,
            context_tokens=same_as.context_tokens,
            context_tool_tokens=same_as.context_tool_tokens,
            context_start_seq=same_as.context_start_seq,
            summary_seq=same_as.summary_seq,
            pinned_seqs=tuple(same_as.pinned_seqs),
            compaction_count=same_as.compaction_count,
        )
    else:
        at = OnPath(unit.session_id, family, path)
        pivot = await branches.pivot_at(driver, tenant_id, at, landing.seq)
        context, tool = await LogRepository(tenant_id).context_totals(
            driver,
            at,
            pivot.start_seq,
            list(pivot.pinned_seqs),
            pivot.summary_seq,
            end_seq=landing.seq + 1,
        )
        moved = ledger.PathMoved(
            next_seq=landing.seq + 1,
            stored_tokens=landing.path_tokens,
            context_tokens=context,
            context_tool_tokens=tool,
            context_start_seq=pivot.start_seq,
            summary_seq=pivot.summary_seq,
            pinned_seqs=pivot.pinned_seqs,
            compaction_count=pivot.count,
        )
    await _follow(unit, path, moved)
    return path


async def restart_at_root(unit: Unit) -> Path:
    """Make the session's path a new, empty branch from the root (in the caller's unit
    of work): the next append is its seq 1, and every entry the session held stays in
    its tree, on the branches it leaves. What :func:`move_leaf` does after the move
    (an active compaction cancelled, the proxy's record dropped) is done too."""
    path = await branches.new_root_branch(
        unit.driver, unit.tenant_id, unit.state.family_id, unit.session_id
    )
    empty = ledger.PathMoved(
        next_seq=1,
        stored_tokens=0,
        context_tokens=0,
        context_tool_tokens=0,
        context_start_seq=1,
        summary_seq=None,
        pinned_seqs=(),
        compaction_count=0,
    )
    await _follow(unit, path, empty)
    return path


async def _follow(unit: Unit, path: Path, moved: ledger.PathMoved) -> None:
    """The session follows ``path``, whose totals are ``moved``'s."""
    state = unit.state
    state.path_branches, state.path_ends = list(path.branches), list(path.ends)
    unit.apply(moved)
    state.compaction_held_seq = None
    state.served_version = state.served_context_tokens = None
    state.served_compaction_id = None
    await cancel_active(unit, "the session moved to another path of its tree")
    await branches.forget_proxy_history(unit.driver, unit.tenant_id, unit.session_id)
    await unit.save()


def moved_on(state: SessionState, nav: Navigation) -> bool:
    """Whether the session left the point the navigation started from."""
    return state.path != nav.from_path or state.next_seq != nav.from_next_seq


async def commit_branch(
    unit: Unit,
    job: JobRow,
    nav: Navigation,
    plan: Plan,
    summarized: Summarized,
    *,
    now: datetime,
) -> Outcome:
    """Move the leaf to the target and append the summary after it, in the caller's
    unit of work (the session and the job locked, the session not moved on)."""
    state, driver = unit.state, unit.driver
    landing = await branches.landing_at(
        driver, unit.tenant_id, state.family_id, nav.target_branch, nav.target_seq, placed=True
    )
    if landing is None:  # pragma: no cover - entries are never deleted while reached
        raise RuntimeError("the navigation's target is gone")
    if state.active_compaction_id == job.id:
        state.active_compaction_id = None  # this job: done now, not to be cancelled
    before = state.context_tokens
    await move_leaf(unit, landing, nav.target)
    encoding = catalog.lookup(state.model).encoding
    seq = state.next_seq
    entry = pivot_rules.user_entry(
        seq, branch_summary.KIND, branch_summary.entry_text(summarized.summary), encoding
    )
    stored = stored_entry(entry)
    at = OnPath.of(unit.session_id, state)
    await LogRepository(unit.tenant_id).insert_entry(
        driver, at, stored, now, state.stored_tokens + stored.tokens, job.id
    )
    unit.apply(ledger.Appended((ledger.Added(stored.tokens),)))
    await unit.save()
    await events.emit(
        driver,
        unit.tenant_id,
        unit.session_id,
        "session.navigated",
        {
            "from_leaf_seq": nav.from_next_seq - 1,
            "to_leaf_seq": nav.target_seq,
            "to_entry_id": str(landing.id),
            "abandoned_seqs": nav.from_next_seq - 1 - nav.common_seq,
            "branch_summary_seq": seq,
            "compaction_id": str(job.id),
        },
    )
    return Outcome(
        summary=summarized.summary,
        short_summary=summarized.short_summary,
        summarizer_used=summarized.used,
        source_start_seq=plan.start_seq,
        first_kept_seq=plan.first_kept_seq,
        entry_seq=seq,
        tokens_before=before,
        tokens_after=state.context_tokens,
        details={
            **plan.details,
            "navigation": nav.details(),
            "notes": summarized.notes,
            # What the navigation's hooks said (app.compactions.hooks), kept on the job.
            **{k: v for k, v in (job.details or {}).items() if k in ("hooks",)},
            **({"from_hook": True} if summarized.used == "hook" else {}),
        },
        upstream_model=summarized.upstream_model,
        upstream_usage=summarized.usage,
    )
