"""The context's tokens recounted from stored rows, in memory.

The service recounts the context after a pivot moves in SQL (the store's
``_CONTEXT_TOTALS_SQL``) and hands the sums to the ledger
(``app.engine.accounting.ledger.PivotMoved``). :func:`recount` is the same sums over rows
in memory: the brute force the ledger's property tests check the running totals against,
and the stand-in for that SQL in the continuity replay (bench/continuity.py), which runs
the engine with no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

TOOL_ROLE = "tool"
# The kind of a compaction's summary entry: only the latest one is in the context.
COMPACTION_KIND = "compaction"


class CountedEntry(Protocol):
    """What the recount needs of a stored entry."""

    @property
    def seq(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def kind(self) -> str: ...  # "message", "compaction" (a summary), "continue"
    @property
    def tokens(self) -> int: ...  # as stored: before any prune


def recount(
    entries: Iterable[CountedEntry],
    marks: Mapping[int, int],
    start_seq: int,
    summary_seq: int | None,
    pinned_seqs: Iterable[int],
) -> tuple[int, int]:
    """The context's tokens, and its tool-output tokens, from the stored rows.

    The context is the window (``seq >= start_seq``) without the summaries
    but the latest (``summary_seq``; earlier ones the window may still reach
    are replaced by it), plus the pinned system entries. A pruned output
    counts its placeholder (``marks``: seq to the placeholder's tokens); marks
    before the window are not read (pinned entries are system entries, which
    pruning never marks). ``entries`` may hold any of the session's rows; the
    others are skipped.

    The same sums as the store's ``_CONTEXT_TOTALS_SQL``, to its corners: a pinned seq inside the window would count twice there, and
    does here (there is none: the pinned entries are those before the window).
    """
    pinned = frozenset(pinned_seqs)
    context = tool = 0
    for entry in entries:
        seq = entry.seq
        in_window = seq >= start_seq and (entry.kind != COMPACTION_KIND or seq == summary_seq)
        # How often the entry counts: as the SQL's UNION ALL of the window and
        # the pinned entries would count it.
        times = int(in_window) + int(seq in pinned)
        if not times:
            continue
        tokens = entry.tokens
        if seq >= start_seq and seq in marks:
            tokens = marks[seq]
        context += tokens * times
        if entry.role == TOOL_ROLE:
            tool += tokens * times
    return context, tool
