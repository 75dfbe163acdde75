"""Preparing a compaction (seed 001): what is summarized, what is kept, and the
summary's final shape. Pure: the service reads the entries, this decides.

Only entries since the latest pivot are considered. System and developer
entries are never summarized: they are the agent's instructions, so the
context keeps them (``pinned``) wherever the cut falls. Earlier compaction
entries in the window are not messages of the view; the previous summary is
carried into the new one instead (the update prompt, or the extractive merge).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine import cut as cuts
from app.engine.fileops import FileOps, collect
from app.engine.model import Entry
from app.engine.summary import merge_split_turn, with_file_tags

PINNED_ROLES = frozenset({"system", "developer"})
# Entries the service wrote as user prompts of its own, never the agent's words.
SYNTHETIC_KINDS = frozenset({"continue"})

# Never keep more than this share of the compaction threshold verbatim: a
# compaction that keeps most of the window would be followed by another at once.
KEEP_SHARE = 0.5
EMERGENCY_KEEP_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Source:
    """An entry since the pivot. ``entry.tokens`` is what it costs in the view
    (a pruned output, its placeholder); ``link_id``/``view_call_ids`` are the
    ids the view pairs by (a reused call id gets its own)."""

    seq: int
    kind: str
    entry: Entry
    link_id: str | None = None
    view_call_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Item:
    role: str
    tokens: int
    tool_call_id: str | None
    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    start_seq: int
    first_kept_seq: int
    history: list[Entry]  # summarized as the history
    turn_prefix: list[Entry]  # the start of a turn the cut splits; empty if none
    pinned: list[int]  # system entries before the cut, kept in the context
    summarized_tokens: int
    kept_tokens: int
    file_ops: FileOps
    details: dict[str, Any] = field(default_factory=dict)
    summary_chars: int = 12_000  # how long an extractive summary may be

    @property
    def split_turn(self) -> bool:
        return bool(self.turn_prefix)


def keep_tokens(keep_recent_tokens: int, threshold_tokens: int, *, emergency: bool) -> int:
    """How much recent history a compaction keeps verbatim: the configured
    amount, but never so much that the context would stay near the threshold."""
    share = EMERGENCY_KEEP_SHARE if emergency else KEEP_SHARE
    return max(0, min(keep_recent_tokens, int(threshold_tokens * share)))


def summary_chars(threshold_tokens: int, summarized_tokens: int | None = None) -> int:
    """How long a summary made without a model may be: about 15% of the
    compaction threshold (at ~4 characters a token), within 2,000-12,000
    characters, so that a small window is not filled by its own summary; and
    no more than about half of what it summarizes (2 characters a summarized
    token), so that a summary never comes out as long as its source (such a
    compaction would not be committed)."""
    cap = min(12_000, threshold_tokens * 6 // 10)
    if summarized_tokens is not None:
        cap = min(cap, summarized_tokens * 2)
    return max(2_000, cap)


def plan(
    sources: Sequence[Source],
    *,
    start_seq: int,
    end_seq: int,
    keep: int,
    previous_details: dict[str, Any] | None,
    threshold_tokens: int = 20_000,
) -> Plan | None:
    """Where to cut, or None when nothing can be summarized (too little history,
    or no cut point that keeps every call with its results)."""
    messages = [s for s in sources if s.kind != "compaction" and s.entry.role not in PINNED_ROLES]
    items = [
        _Item(
            s.entry.role,
            s.entry.tokens,
            (s.link_id or s.entry.tool_call_id) if s.entry.role == "tool" else None,
            s.view_call_ids if s.view_call_ids else s.entry.call_ids,
        )
        for s in messages
    ]
    # The "continue" prompts earlier automatic compactions added (see cut.py).
    synthetic = [k for k, s in enumerate(messages) if s.kind in SYNTHETIC_KINDS]
    cut = cuts.find_cut(items, keep, synthetic=synthetic)
    if cut.first_kept == 0:
        return None
    first_kept_seq = messages[cut.first_kept].seq if cut.first_kept < len(messages) else end_seq
    summarized = [s.entry for s in messages[: cut.first_kept]]
    turn_start = cut.turn_start if cut.turn_start is not None else cut.first_kept
    history = summarized[:turn_start]
    prefix = summarized[turn_start:]
    pinned = [s.seq for s in sources if s.entry.role in PINNED_ROLES and s.seq < first_kept_seq]
    previous = FileOps.from_details(previous_details) if previous_details else None
    ops = collect(summarized, previous)
    return Plan(
        start_seq=start_seq,
        first_kept_seq=first_kept_seq,
        history=history,
        turn_prefix=prefix,
        pinned=pinned,
        summarized_tokens=cut.summarized_tokens,
        kept_tokens=cut.kept_tokens,
        file_ops=ops,
        summary_chars=summary_chars(threshold_tokens, cut.summarized_tokens),
        details={
            **ops.to_details(),
            "split_turn": bool(prefix),
            "summarized_entries": len(summarized),
            "summarized_tokens": cut.summarized_tokens,
            "kept_tokens": cut.kept_tokens,
        },
    )


def capped_files(ops: FileOps, max_chars: int) -> tuple[list[str], list[str]]:
    """The file lists as the summary shows them, within ``max_chars``: modified
    files first, then read ones; what does not fit is counted, not listed (the
    job's details keep every path). Without a cap the lists, cumulative across
    compactions, would grow each summary until it filled the window."""
    budget = max_chars
    shown: dict[str, list[str]] = {"modified": [], "read": []}
    for kind, paths in (("modified", ops.modified), ("read", ops.read)):
        for path in paths:
            if len(path) + 1 > budget:
                break
            shown[kind].append(path)
            budget -= len(path) + 1
        hidden = len(paths) - len(shown[kind])
        if hidden:
            shown[kind].append(f"(and {hidden} more)")
    return shown["read"], shown["modified"]


def final_summary(
    history_summary: str, turn_prefix_summary: str | None, ops: FileOps, max_chars: int = 12_000
) -> str:
    """The stored summary: the history, the split turn's prefix under its own
    heading, and the files read and modified so far (at most a quarter of
    ``max_chars``, the summary's size)."""
    text = history_summary
    if turn_prefix_summary:
        text = merge_split_turn(history_summary, turn_prefix_summary)
    read, modified = capped_files(ops, max(400, max_chars // 4))
    return with_file_tags(text, read, modified)
