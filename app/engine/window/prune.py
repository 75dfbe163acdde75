"""Which old tool outputs to hide from the model (docs/how-it-works.md, "Pruning").

Pruning is soft compaction: a pruned tool result stays stored, and the view
shows a short placeholder in its place. :func:`plan_prune` only decides which
ones; the caller marks them. It walks the current view (from the latest summary
pivot on) back from the newest entry:

- the last ``protect_turns`` user turns are never touched;
- the newest ``protect_tokens`` of tool output are kept, counted newest first
  over every tool output walked, those in the protected turns included; the
  output that crosses the threshold is kept whole (we never split an entry);
- older tool outputs are candidates, except outputs of a protected tool (they
  act as instructions and do not count toward the budget either) and outputs
  no bigger than the placeholder (nothing to gain). ``protected_tools`` holds
  names and fnmatch-style patterns, all case-insensitive: ``["skill", "tool-*"]``
  protects ``skill`` by name and every tool whose type starts with ``tool-`` by
  prefix;
- the walk stops at a summary pivot and at the first entry already pruned: all
  that is older was settled by an earlier prune, which makes planning again
  after applying a plan a no-op.

Nothing is pruned unless it saves at least ``minimum_tokens``: small gains are
not worth a change of the prompt prefix (and of the provider's prompt cache).
The walk is one plain loop, O(n), with no allocation per entry but the output.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

SkipReason = Literal["nothing_prunable", "below_minimum"]


class PruneItem(Protocol):
    """What the planner needs to know of an entry of the view."""

    @property
    def seq(self) -> int: ...
    @property
    def role(self) -> str: ...  # "system" | "developer" | "user" | "assistant" | "tool"
    @property
    def kind(self) -> str: ...  # "message" | "summary" (a compaction summary pivot)
    @property
    def tool_name(self) -> str | None: ...  # the tool that produced a "tool" entry
    @property
    def tokens(self) -> int: ...  # what the entry takes in the view now
    @property
    def pruned(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Item:
    """A light entry of the view, for callers (and tests) that have no row at hand."""

    seq: int
    role: str
    kind: str = "message"
    tool_name: str | None = None
    tokens: int = 0
    pruned: bool = False


@dataclass(frozen=True, slots=True)
class PruneSettings:
    protect_tokens: int = 40_000  # newest tool-output tokens kept
    minimum_tokens: int = 20_000  # prune only if at least this many tokens are saved
    protect_turns: int = 2  # the last N user turns are never touched
    protected_tools: frozenset[str] = frozenset({"skill"})  # names and fnmatch patterns
    placeholder_tokens: int = 10  # what a pruned output still costs in the view

    def __post_init__(self) -> None:
        for name in ("protect_tokens", "minimum_tokens", "protect_turns", "placeholder_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


@dataclass(frozen=True, slots=True)
class PrunePlan:
    seqs: tuple[int, ...]  # tool results to prune, oldest first
    tokens_saved: int  # sum of (tokens - placeholder_tokens) over seqs
    candidate_tokens: int  # what would be saved with a minimum of 0
    reason: SkipReason | None  # None when seqs is non-empty
    protected_tokens: int  # tool-output tokens kept by the protection window
    scanned: int  # entries examined, the one that stopped the walk included


_WILDCARDS = frozenset("*?[")


def is_pattern(name: str) -> bool:
    """Whether a ``protected_tools`` entry is a pattern (``*``, ``?`` or ``[``) rather than a name."""
    return not _WILDCARDS.isdisjoint(name)


def protection(protected_tools: Collection[str]) -> Callable[[str], bool]:
    """Whether a tool name is protected: equal to a name, or matching a pattern
    (fnmatch's ``*``, ``?`` and ``[...]``), case-insensitive either way."""
    names = frozenset(p.casefold() for p in protected_tools if not is_pattern(p))
    patterns = [fnmatch.translate(p.casefold()) for p in protected_tools if is_pattern(p)]
    if not patterns:
        return lambda name: name.casefold() in names
    matcher = re.compile("|".join(f"(?:{p})" for p in patterns), re.DOTALL)
    return lambda name: (folded := name.casefold()) in names or matcher.match(folded) is not None


def plan_prune(items: Sequence[PruneItem], settings: PruneSettings) -> PrunePlan:
    """The tool results to prune in ``items`` (the view, oldest first)."""
    protect_tokens = settings.protect_tokens
    protect_turns = settings.protect_turns
    placeholder = settings.placeholder_tokens
    protects = protection(settings.protected_tools)
    # One match per distinct tool name, not per entry.
    is_protected: dict[str, bool] = {}

    turns = 0  # user messages walked so far
    kept = 0  # tool-output tokens counted toward the protection budget
    saved = 0
    newest_first: list[int] = []
    scanned = 0
    for item in reversed(items):
        scanned += 1
        if item.kind == "summary" or item.pruned:
            break
        role = item.role
        if role == "user":
            turns += 1
            continue
        if role != "tool":
            continue
        name = item.tool_name
        if name is not None:
            protected = is_protected.get(name)
            if protected is None:
                protected = is_protected[name] = protects(name)
            if protected:
                continue
        tokens = item.tokens
        if turns < protect_turns or kept < protect_tokens:
            kept += tokens
        elif tokens > placeholder:
            saved += tokens - placeholder
            newest_first.append(item.seq)

    if not newest_first:
        return PrunePlan((), 0, 0, "nothing_prunable", kept, scanned)
    if saved < settings.minimum_tokens:
        return PrunePlan((), 0, saved, "below_minimum", kept, scanned)
    newest_first.reverse()
    return PrunePlan(tuple(newest_first), saved, saved, None, kept, scanned)


def apply(items: Sequence[PruneItem], plan: PrunePlan, placeholder_tokens: int) -> list[Item]:
    """``items`` as they read once ``plan`` is applied: its entries pruned, at the
    placeholder's cost."""
    chosen = frozenset(plan.seqs)
    return [
        Item(
            seq=item.seq,
            role=item.role,
            kind=item.kind,
            tool_name=item.tool_name,
            tokens=placeholder_tokens if item.seq in chosen else item.tokens,
            pruned=item.pruned or item.seq in chosen,
        )
        for item in items
    ]
