"""Where a compaction cuts the history: everything before the cut is summarized,
everything from it on is kept verbatim.

The caller hands :func:`find_cut` the entries since the latest summary pivot, oldest
first, without the pinned system and developer entries. Where a cut may fall (never at a
tool result, never between a call and its results, never through a running call), which
valid cut is taken (the nearest at or before ``keep_recent_tokens``), how stale
synthetic prompts move it, and how a split turn's prefix is found are specified in
docs/compaction-heuristics.md, "Where the cut falls". Everything runs in a few linear
passes: 100k entries take well under a second.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.engine.window.context import Linked


class Cuttable(Linked, Protocol):
    """What the cut needs to know of an entry (:class:`app.engine.model.Entry` fits)."""

    @property
    def tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class CutItem:
    """A light entry, for callers (and tests) that have no row at hand."""

    role: str
    tokens: int = 0
    tool_call_id: str | None = None
    call_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Cut:
    """``items[:first_kept]`` are summarized, ``items[first_kept:]`` are kept.

    When the cut splits a turn, ``items[:turn_start]`` are the history and
    ``items[turn_start:first_kept]`` the turn prefix; ``turn_start`` is None
    when no turn is split.
    """

    first_kept: int  # 0: nothing to summarize
    turn_start: int | None
    kept_tokens: int
    summarized_tokens: int

    @property
    def split_turn(self) -> bool:
        return self.turn_start is not None


def find_cut(
    items: Sequence[Cuttable], keep_recent_tokens: int, *, synthetic: Collection[int] = ()
) -> Cut:
    """Where to cut ``items`` so at least ``keep_recent_tokens`` are kept, if possible.

    ``synthetic``: indices of prompts the service added (see "Stale prompts").
    """
    if keep_recent_tokens < 0:
        raise ValueError("keep_recent_tokens must not be negative")
    n = len(items)
    prefix = [0] * (n + 1)  # prefix[i]: tokens of items[:i]
    for i, item in enumerate(items):
        prefix[i + 1] = prefix[i] + item.tokens
    total = prefix[n]
    if n == 0 or total < keep_recent_tokens:
        return Cut(0, None, total, 0)

    stale = {i for i in synthetic if 0 <= i < n - 1}
    valid = _valid_cuts(items)
    # A stale prompt, and the hollow entries right before it (calls never answered,
    # results of no call: the view drops them), never head the kept part: cutting
    # there would still show the prompt right after the summary.
    behind: dict[int, int] = {}  # a cut here moves right behind the stale prompt
    hollow = _hollow(items) if stale else []
    for i in stale:
        j = i
        while True:
            valid[j] = False
            behind[j] = i + 1
            if j == 0 or not hollow[j - 1]:
                break
            j -= 1
    # The candidate: the largest i with tokens(items[i:]) >= keep_recent_tokens.
    candidate = n
    while total - prefix[candidate] < keep_recent_tokens:
        candidate -= 1
    candidate = behind.get(candidate, candidate)  # the stale prompt goes with what it followed
    first_kept = next((i for i in range(candidate, 0, -1) if valid[i]), 0)
    if first_kept == 0:
        first_kept = next((i for i in range(candidate + 1, n + 1) if valid[i]), 0)
    return Cut(
        first_kept,
        _turn_start(items, first_kept, frozenset(synthetic)),
        kept_tokens=total - prefix[first_kept],
        summarized_tokens=prefix[first_kept],
    )


def _valid_cuts(items: Sequence[Cuttable]) -> list[bool]:
    """``valid[i]`` for every ``0 <= i <= len(items)``; ``valid[0]`` is always False."""
    n = len(items)
    # closes[j]: the last index a call made by items[j] holds the cut back to; a cut
    # at i is blocked by items[j] when j < i <= closes[j].
    closes = [-1] * n
    latest: dict[str, int] = {}  # call id -> index of the latest call with it
    answered: dict[str, bool] = {}  # call id -> whether that latest call has a result
    last_turn = -1  # the newest entry that is not a tool result
    for i, item in enumerate(items):
        if item.role == "tool":
            owner = latest.get(item.tool_call_id) if item.tool_call_id is not None else None
            if owner is not None and item.tool_call_id is not None:
                closes[owner] = i  # results come in order, so i is the furthest yet
                answered[item.tool_call_id] = True
            continue
        last_turn = i
        for call_id in item.call_ids:
            latest[call_id] = i
            answered[call_id] = False
    if last_turn >= 0 and any(not answered[c] for c in items[last_turn].call_ids):
        closes[last_turn] = n  # still running: nothing from it on may be summarized

    valid = [False] * (n + 1)
    reach = -1  # max of closes[j] over j < i
    for i in range(1, n + 1):
        reach = max(reach, closes[i - 1])
        valid[i] = reach < i and (i == n or items[i].role != "tool")
    return valid


def _hollow(items: Sequence[Cuttable]) -> list[bool]:
    """``hollow[i]``: the view may show nothing of ``items[i]``: an assistant turn
    whose calls are all left unanswered, or a tool result that answers no call before
    it. (Text is not known here: an assistant with words is taken as hollow too,
    which only moves a cut a little later.)"""
    hollow = [False] * len(items)
    latest: dict[str, int] = {}  # call id -> index of the latest call with it
    answered = [False] * len(items)
    for i, item in enumerate(items):
        if item.role == "tool":
            owner = latest.get(item.tool_call_id) if item.tool_call_id is not None else None
            if owner is None:
                hollow[i] = True
            else:
                answered[owner] = True
            continue
        for call_id in item.call_ids:
            latest[call_id] = i
    for i, item in enumerate(items):
        if item.role == "assistant" and item.call_ids and not answered[i]:
            hollow[i] = True
    return hollow


def _turn_start(
    items: Sequence[Cuttable], first_kept: int, synthetic: frozenset[int]
) -> int | None:
    if first_kept == 0 or first_kept == len(items) or items[first_kept].role == "user":
        return None
    return next(
        (
            i
            for i in range(first_kept - 1, -1, -1)
            if items[i].role == "user" and i not in synthetic
        ),
        0,
    )
