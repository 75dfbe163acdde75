"""The rules of moving a session's pivot, pure: what a compaction keeps, what it
plans with, the entries it appends, and whether it is committed.

:mod:`app.compactions.pivot` reads the session's rows and writes the result in
one transaction; everything it decides in between is decided here, so that the
in-memory replay of :mod:`bench.continuity` runs the very same rules and not a
copy of them. The service's database reads (the stored entries, the kept
window's totals, the tail of the log) are the callers' and come in as values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.accounting import budget, ledger
from app.engine.accounting.tokens import EncodingName, count_entry
from app.engine.compaction import prepare as compaction
from app.engine.compaction.summary import render_context_message, sources_line, strip_user_requests
from app.engine.model import Entry

LOW_YIELD_SHARE = 0.05  # a compaction saving less holds the next automatic one
CONTINUE_TEXT = "Continue if you have next steps."
# Finish reasons of a reply cut off by the output limit (OpenAI, Anthropic, Gemini).
CUT_OFF = frozenset({"length", "max_tokens", "model_length"})
# Reasons whose compaction must relieve the window now: it keeps less.
URGENT_REASONS = frozenset({"emergency", "overflow"})


# --- preparing ----------------------------------------------------------------


def keep_for(
    reason: str, *, keep_recent_tokens: int, trigger_tokens: int, context_tokens: int
) -> int:
    """How much recent history the compaction keeps verbatim (see
    :func:`app.engine.compaction.prepare.keep_tokens`). After an overflow (the provider
    refused a prompt this session's estimate thought would fit) a share of what
    the context holds, whatever the window says."""
    keep = compaction.keep_tokens(
        keep_recent_tokens, trigger_tokens, emergency=reason in URGENT_REASONS
    )
    if reason == "overflow":
        keep = min(keep, context_tokens // 4)
    return keep


def plan(
    sources: Sequence[compaction.Source],
    *,
    reason: str,
    start_seq: int,
    end_seq: int,
    context_tokens: int,
    trigger_tokens: int,
    keep_recent_tokens: int,
    keep_requests_tokens: int,
    previous_details: dict[str, Any] | None,
    encoding: EncodingName,
) -> compaction.Plan | None:
    """The compaction's plan over ``sources`` (the entries since the pivot), with
    the session's settings; None when there is nothing to compact."""
    return compaction.plan(
        sources,
        start_seq=start_seq,
        end_seq=end_seq,
        keep=keep_for(
            reason,
            keep_recent_tokens=keep_recent_tokens,
            trigger_tokens=trigger_tokens,
            context_tokens=context_tokens,
        ),
        previous_details=previous_details,
        threshold_tokens=trigger_tokens,
        keep_requests_tokens=keep_requests_tokens,
        encoding=encoding,
    )


def previous_summary(summary: str | None) -> str | None:
    """The previous summary as the summarizer is shown it: without its quoted
    requests. The new summary quotes them afresh (from the details), and a
    summarizer shown them would only copy them again."""
    return strip_user_requests(summary) if summary is not None else None


# --- committing ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PivotEntry:
    """An entry a compaction appends: the summary (``compaction``), maybe a
    synthetic ``continue`` after it. A user message; ``entry.tokens`` counted."""

    seq: int
    kind: str
    entry: Entry


def user_entry(seq: int, kind: str, text: str, encoding: EncodingName) -> PivotEntry:
    """A user message compactd writes itself (a summary, a "continue", a branch
    summary) at ``seq``, its tokens counted."""
    return _user_entry(seq, kind, text, encoding)


def _user_entry(seq: int, kind: str, text: str, encoding: EncodingName) -> PivotEntry:
    entry = Entry(role="user", parts=[{"type": "text", "text": text}], content_form="string")
    entry.tokens = count_entry(entry, encoding)
    return PivotEntry(seq, kind, entry)


def continues(
    *,
    role: str,
    kind: str,
    makes_calls: bool,
    finish_reason: str | None,
    calls_pending: bool,
) -> bool:
    """Whether a synthetic "continue" should follow an automatic compaction whose
    log ends on this entry (its ``role`` and ``kind``, whether it ``makes_calls``;
    ``finish_reason`` of the session's last usage report; ``calls_pending``: the
    latest turn's calls do not all have their results yet, read for a tool
    result only).

    Only when the agent was interrupted mid-work: its last entry is a tool
    result and every call of that turn has its result (a user message while
    calls still run would hide them from the view), or its last reply was cut
    off by the output limit. Not after a reply that ended on its own (no
    calls, any other finish reason), nor after a user message, which already
    asks for the next step.
    """
    if kind != "message":
        return False
    if role == "tool":
        return not calls_pending
    if role == "assistant":
        return not makes_calls and (finish_reason or "").lower() in CUT_OFF
    return False


def pivot_entries(
    seq: int,
    summary: str,
    *,
    continued: bool,
    encoding: EncodingName,
    replaced: tuple[int, int] | None = None,
    compaction_id: str | None = None,
) -> list[PivotEntry]:
    """The entries the compaction appends from ``seq`` on: the summary as the
    context shows it (with the line that says where the entries it ``replaced``, a
    seq range, are still read), then the "continue" when ``continued``."""
    sources = "" if replaced is None else sources_line(*replaced, compaction_id)
    new = [_user_entry(seq, "compaction", render_context_message(summary, sources), encoding)]
    if continued:
        new.append(_user_entry(seq + 1, "continue", CONTINUE_TEXT, encoding))
    return new


def pinned_after(pinned_seqs: Iterable[int], plan: compaction.Plan) -> tuple[int, ...]:
    """The entries the context keeps before its window once the pivot moved: those
    it kept already, and those the plan keeps whole (system, pinned on append)."""
    return tuple(sorted(set(pinned_seqs) | set(plan.pinned)))


def moved(
    plan: compaction.Plan,
    new: Sequence[PivotEntry],
    pinned: Sequence[int],
    *,
    window_tokens: int,
    window_tool_tokens: int,
) -> ledger.PivotMoved:
    """The ledger's event: ``window_tokens``/``window_tool_tokens`` are the kept
    window's totals (the store's ``_CONTEXT_TOTALS_SQL`` over the stored rows, with
    the summary's seq), read before the new entries exist."""
    return ledger.PivotMoved(
        added=tuple(e.entry.tokens for e in new),
        context_start_seq=plan.first_kept_seq,
        summary_seq=new[0].seq,
        pinned_seqs=tuple(pinned),
        window_tokens=window_tokens,
        window_tool_tokens=window_tool_tokens,
    )


def estimate_from_counts(accounting: budget.Accounting, context_tokens: int) -> int:
    """The estimate of a context of ``context_tokens`` counted tokens from the
    counts alone (calibrated, plus overhead), without the reported base: the
    base measured the context as it was, so before and after a compaction only
    estimates made this way compare like with like."""
    return budget.estimate(
        dataclasses.replace(
            accounting,
            context_tokens=context_tokens,
            reported_prompt_tokens=None,
            context_tokens_at_report=None,
        )
    )


@dataclass(frozen=True, slots=True)
class Judged:
    """Whether the compaction is committed, and what it yields.

    ``gain`` False: the context would be no smaller (counted tokens,
    ``tokens_before`` and ``tokens_after``); nothing is written and automatic
    compaction is held until new history arrives. ``low_yield``: committed, but
    saving less than ``LOW_YIELD_SHARE`` of the estimate (both sides estimated
    from counts, the overhead in both): the next automatic compaction is held
    until new history arrives."""

    gain: bool
    low_yield: bool
    tokens_before: int
    tokens_after: int


def judge(accounting: budget.Accounting, move: ledger.PivotMoved) -> Judged:
    """Judged on counted tokens before and after, never against the estimate
    before: its exact base is the provider's last reported prompt, another
    tokenizer than ours, which the calibration factor (one EMA step per report)
    may not have caught up with, so a compaction that shrinks the context could
    look like one that grows it."""
    before, after = accounting.context_tokens, move.context_tokens
    if after >= before:
        return Judged(False, False, before, after)
    from_counts_before = estimate_from_counts(accounting, before)
    from_counts_after = estimate_from_counts(accounting, after)
    low_yield = from_counts_before - from_counts_after < LOW_YIELD_SHARE * from_counts_before
    return Judged(True, low_yield, before, after)
