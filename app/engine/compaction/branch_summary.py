"""Branch summaries (docs/how-it-works.md, "The tree"): when a navigation leaves a branch, what was tried
there is summarized into an entry after the navigation target, so that the new
path knows it.

The abandoned branch is the old path's entries after the common ancestor. The
summarizer reads its newest entries up to a token budget (the model's window less
``branch_summary.reserve_tokens``), newest first, so recent work is kept (the details
index what those entries name: :func:`app.engine.compaction.dropped.index`); the file
operations are collected over the whole branch and carried on from the latest
compaction before it. The summary is then given the preamble that tells the model
what it is. The plan is a :class:`~app.engine.compaction.prepare.Plan` so the compaction's
summarizers (model or extractive) write it.

Pure: no database, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.engine.accounting.tokens import EncodingName
from app.engine.compaction import dropped
from app.engine.compaction.fileops import FileOps, collect
from app.engine.compaction.prepare import Plan, Source, summary_chars
from app.engine.compaction.summary import carried_media, media_as_pointers, media_pointers

KIND = "branch_summary"

PREAMBLE = (
    "The user explored a different conversation branch before returning here.\n"
    "Summary of that exploration:\n\n"
)

# What the summarizer is asked for when the navigation gives no instructions.
INSTRUCTIONS = (
    "This is a branch of the conversation that the user has left to go back to an "
    "earlier point. Summarize what was attempted on it, what was learned, which files "
    "were read and changed, what worked and what failed (with the exact error), and "
    "anything the conversation should know when it goes on from the earlier point."
)


def plan(
    sources: Sequence[Source],
    *,
    budget_tokens: int,
    previous_details: Mapping[str, Any] | None,
    encoding: EncodingName,
    start_seq: int,
    end_seq: int,
) -> Plan:
    """The plan of the branch summary of ``sources`` (the abandoned entries, oldest
    first, ``start_seq <= seq < end_seq``): the newest of them within
    ``budget_tokens`` (at least the newest one), the file operations of them all."""
    chosen: list[Source] = []
    used = 0
    for source in reversed(sources):
        tokens = source.entry.tokens
        if chosen and used + tokens > budget_tokens:
            break
        chosen.append(source)
        used += tokens
    chosen.reverse()
    previous = FileOps.from_details(previous_details) if previous_details else None
    ops = collect((s.entry for s in sources), previous)
    return Plan(
        start_seq=start_seq,
        first_kept_seq=end_seq,
        # Its images and documents reach the summarizer as pointer lines, never as bytes.
        history=[media_as_pointers(s.entry, s.seq) for s in chosen],
        turn_prefix=[],
        pinned=[],
        summarized_tokens=used,
        kept_tokens=0,
        file_ops=ops,
        summary_chars=summary_chars(budget_tokens, used),
        encoding=encoding,
        replaced_tokens=used,
        details={
            **ops.to_details(),
            "branch_summary": True,
            "abandoned_entries": len(sources),
            "summarized_entries": len(chosen),
            "summarized_tokens": used,
            "dropped": dropped.index([s.entry for s in chosen], files=ops),
            "media": carried_media([], media_pointers([(s.seq, s.entry) for s in chosen])),
        },
    )


def entry_text(summary: str) -> str:
    """The branch summary entry's text: the preamble, then the summary."""
    return PREAMBLE + summary
