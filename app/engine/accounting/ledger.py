"""A session's running totals as pure transitions: the ledger.

The ``session`` row carries totals that are kept, not recounted: how many
entries the log holds and their tokens, what the model's context holds now
(and how much of it is tool output), where the pivot stands, what pruning
saved, and the usage accounting the estimate rests on (docs/how-it-works.md,
"Accounting, verdicts and pruning"). Every write of the session advances them,
and a total that drifts from the rows it sums makes every later verdict wrong.
So each write is an event, and :func:`apply` is the one place that says what an
event does to the totals: storage loads the totals, applies the event and writes
the result, and the property tests check the result against a recount of the
stored rows (tests/recount.py) after every step.

The context after a pivot moves is the one total recounted rather than advanced
(a pivot changes which entries the context holds, not just how many): storage
sums the stored rows and hands the sums to :class:`PivotMoved`.

Pure: no database, no clock, no settings. The figures an event carries (token
counts, the calibration factor) are computed elsewhere in the engine and only
recorded here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Totals:
    """The session's running totals, field for field the ``session`` columns of
    the same names (``pinned_seqs`` a tuple here, an array there).

    The defaults are a new session's: version 1, an empty log, the context
    starting at seq 1, no usage reported.
    """

    # From the log: what the entries and prune marks add up to.
    version: int = 1  # bumped by every change a client can see
    next_seq: int = 1  # the seq the next entry gets
    entry_count: int = 0  # the entries of the path from the root to the leaf
    stored_tokens: int = 0  # of those entries, whether in the context or not
    context_tokens: int = 0  # the context: the window, the summary and the pinned entries
    context_tool_tokens: int = 0  # the part of context_tokens that is tool output
    context_start_seq: int = 1  # the window is seq >= this
    summary_seq: int | None = None  # the latest summary, shown first
    pinned_seqs: tuple[int, ...] = ()  # system entries before the window, kept
    pruned_tokens: int = 0  # saved by pruning, over the session's life
    prune_count: int = 0  # prunes that hid something
    compaction_count: int = 0  # pivots moved
    pivot_version: int | None = None  # the version the last pivot move made
    # From usage reports: the estimate's base and its calibration.
    calibration_factor: float = 1.0
    overhead_tokens: int = 0  # tool schemas and other per-request text never stored
    reported_prompt_tokens: int | None = None  # the last prompt the provider measured
    context_tokens_at_report: int | None = None  # context_tokens of the context it measured
    usage_count: int = 0
    # The last prune's look at the context: an automatic prune looks again only
    # when there is more tool output than then, or more urgency.
    prune_checked_tool_tokens: int | None = None
    prune_checked_urgent: bool | None = None


TOTALS_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Totals))


class Columns(Protocol):
    """A row read by column name: a mapping, or an asyncpg ``Record``."""

    def __getitem__(self, key: str, /) -> Any: ...


def totals_of(row: Columns) -> Totals:
    """The totals of a ``session`` row read by column name (extra columns ignored)."""
    values = {name: row[name] for name in TOTALS_FIELDS}
    values["pinned_seqs"] = tuple(values["pinned_seqs"] or ())
    return Totals(**values)


def changed(before: Totals, after: Totals) -> dict[str, Any]:
    """The columns ``after`` sets on a row at ``before``, by name, as the row
    holds them (``pinned_seqs`` a list): what one writer of the totals updates."""
    out: dict[str, Any] = {}
    for name in TOTALS_FIELDS:
        value = getattr(after, name)
        if value != getattr(before, name):
            out[name] = list(value) if name == "pinned_seqs" else value
    return out


# --- events -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Added:
    """One entry an append writes: its tokens as the model is shown it, and
    whether it is a tool output (role ``tool``), which pruning may later hide.

    ``hidden``: a tool result whose call a compaction already cut off (the call is
    before the window). The view's pairing leaves such a result out, so it is stored
    (its tokens count in ``stored_tokens``) behind a zero-token mark and adds
    nothing to the context."""

    tokens: int
    tool: bool = False
    hidden: bool = False

    def __post_init__(self) -> None:
        _not_negative("tokens", self.tokens)


@dataclass(frozen=True, slots=True)
class Appended:
    """An append stored ``entries`` after the last one, in order. They join the
    window (they are messages, after the pivot), so they add to the context.

    ``overhead_tokens``: what each request adds besides the stored messages (the
    tool schemas the append's request carried), when the append says; None
    leaves the overhead as it was."""

    entries: tuple[Added, ...]
    overhead_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.overhead_tokens is not None:
            _not_negative("overhead_tokens", self.overhead_tokens)


@dataclass(frozen=True, slots=True)
class Pruned:
    """A prune marked outputs in the window; ``tokens_saved`` is the sum, over
    them, of the output's tokens less its placeholder's. ``urgent``: the prune
    no longer protected the last user turns (see ``app.engine.accounting.budget.urgent``)."""

    tokens_saved: int
    urgent: bool

    def __post_init__(self) -> None:
        _not_negative("tokens_saved", self.tokens_saved)


@dataclass(frozen=True, slots=True)
class PruneChecked:
    """A prune (not a dry run) that found nothing worth hiding. Nothing a client
    sees changes, so no new version; the automatic prune remembers where it
    looked, so that it does not look again until there is more to find."""

    urgent: bool


@dataclass(frozen=True, slots=True)
class UsageReported:
    """A usage report about a context the pivot has not replaced: it becomes
    the estimate's exact base. ``context_tokens_at_report`` is what the session
    counted for the context the report measured (the one served, which may be
    older than the totals if the reply was appended before the report)."""

    calibration_factor: float
    overhead_tokens: int
    reported_prompt_tokens: int
    context_tokens_at_report: int

    def __post_init__(self) -> None:
        _not_negative("overhead_tokens", self.overhead_tokens)
        _not_negative("reported_prompt_tokens", self.reported_prompt_tokens)
        _not_negative("context_tokens_at_report", self.context_tokens_at_report)


@dataclass(frozen=True, slots=True)
class StaleUsageReported:
    """A usage report about a context a compaction has replaced since: counted
    and kept, but its prompt measures another context, so neither the
    calibration nor the estimate's base moves. Only the overhead (the tools
    the agent sends) still holds."""

    overhead_tokens: int

    def __post_init__(self) -> None:
        _not_negative("overhead_tokens", self.overhead_tokens)


@dataclass(frozen=True, slots=True)
class PivotMoved:
    """A compaction committed: its entries (the summary at ``summary_seq``,
    maybe a synthetic "continue" after it) were appended, and the context now
    starts at ``context_start_seq``, with the summary first and the system
    entries ``pinned_seqs`` kept.

    ``window_tokens`` and ``window_tool_tokens`` are the new context recounted
    from the stored rows (the store's ``_CONTEXT_TOTALS_SQL``) before the new
    entries are written; the new entries are user messages, so they add to the
    context and never to its tool output (:attr:`context_tokens` is the sum).
    """

    added: tuple[int, ...]  # the tokens of each new entry, in seq order
    context_start_seq: int
    summary_seq: int
    pinned_seqs: tuple[int, ...]
    window_tokens: int
    window_tool_tokens: int

    def __post_init__(self) -> None:
        for tokens in self.added:
            _not_negative("added", tokens)

    @property
    def context_tokens(self) -> int:
        """The context once the pivot has moved: what a compaction is judged by
        (it commits only if this is below the context it replaces)."""
        return self.window_tokens + sum(self.added)


@dataclass(frozen=True, slots=True)
class Patched:
    """A PATCH of the session (model, window, config or metadata): a new version.
    ``config``: the config changed, so new pruning rules may find something
    where the last check did not, and the automatic prune looks again."""

    config: bool


@dataclass(frozen=True, slots=True)
class PathMoved:
    """The session now follows another path of its tree (a navigation, or the
    start of a fork): its leaf is ``next_seq - 1``, the path holds
    ``stored_tokens``, and the pivot and the context are that path's, recounted
    from the stored rows (``context_tokens``, ``context_tool_tokens``; with the
    window from ``context_start_seq``, the summary ``summary_seq`` and the
    kept entries ``pinned_seqs`` of the latest compaction on the path, if any,
    of ``compaction_count``). Like a pivot move, it forgets what was measured
    or checked against the context it replaced."""

    next_seq: int
    stored_tokens: int
    context_tokens: int
    context_tool_tokens: int
    context_start_seq: int
    summary_seq: int | None
    pinned_seqs: tuple[int, ...]
    compaction_count: int

    def __post_init__(self) -> None:
        if self.next_seq < 1:
            raise ValueError(f"next_seq must be at least 1, got {self.next_seq}")
        for name in ("stored_tokens", "context_tokens", "context_tool_tokens"):
            _not_negative(name, getattr(self, name))


# One write of the session, as :func:`apply` takes it.
LedgerEvent = (
    Appended
    | Pruned
    | PruneChecked
    | UsageReported
    | StaleUsageReported
    | PivotMoved
    | PathMoved
    | Patched
)


def _not_negative(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")


# --- transitions --------------------------------------------------------------


def apply(totals: Totals, event: LedgerEvent) -> Totals:
    """The totals after ``event``: exactly what the session's writes do today.

    Every event but :class:`PruneChecked` makes a new version. A pivot move
    recounts the context and forgets what was measured or checked against the
    context it replaced: the last report's base (the agent's next report
    measures the new context) and the last prune check.
    """
    replace = dataclasses.replace
    version = totals.version + 1
    match event:
        case Appended(entries, overhead):
            shown = [e for e in entries if not e.hidden]
            return replace(
                totals,
                version=version,
                overhead_tokens=totals.overhead_tokens if overhead is None else overhead,
                next_seq=totals.next_seq + len(entries),
                entry_count=totals.entry_count + len(entries),
                stored_tokens=totals.stored_tokens + sum(e.tokens for e in entries),
                context_tokens=totals.context_tokens + sum(e.tokens for e in shown),
                context_tool_tokens=totals.context_tool_tokens
                + sum(e.tokens for e in shown if e.tool),
            )
        case Pruned(saved, urgent):
            tool_tokens = totals.context_tool_tokens - saved
            return replace(
                totals,
                version=version,
                context_tokens=totals.context_tokens - saved,
                context_tool_tokens=tool_tokens,
                pruned_tokens=totals.pruned_tokens + saved,
                prune_count=totals.prune_count + 1,
                prune_checked_tool_tokens=tool_tokens,
                prune_checked_urgent=urgent,
            )
        case PruneChecked(urgent):
            return replace(
                totals,
                prune_checked_tool_tokens=totals.context_tool_tokens,
                prune_checked_urgent=urgent,
            )
        case UsageReported(factor, overhead, prompt, at_report):
            return replace(
                totals,
                version=version,
                calibration_factor=factor,
                overhead_tokens=overhead,
                reported_prompt_tokens=prompt,
                context_tokens_at_report=at_report,
                usage_count=totals.usage_count + 1,
            )
        case StaleUsageReported(overhead):
            return replace(
                totals,
                version=version,
                overhead_tokens=overhead,
                usage_count=totals.usage_count + 1,
            )
        case PivotMoved():
            return replace(
                totals,
                version=version,
                pivot_version=version,
                next_seq=totals.next_seq + len(event.added),
                entry_count=totals.entry_count + len(event.added),
                stored_tokens=totals.stored_tokens + sum(event.added),
                context_tokens=event.context_tokens,
                context_tool_tokens=event.window_tool_tokens,
                context_start_seq=event.context_start_seq,
                summary_seq=event.summary_seq,
                pinned_seqs=event.pinned_seqs,
                compaction_count=totals.compaction_count + 1,
                reported_prompt_tokens=None,
                context_tokens_at_report=None,
                prune_checked_tool_tokens=None,
                prune_checked_urgent=None,
            )
        case PathMoved():
            return replace(
                totals,
                version=version,
                pivot_version=version,
                next_seq=event.next_seq,
                entry_count=event.next_seq - 1,  # a path holds one entry per seq
                stored_tokens=event.stored_tokens,
                context_tokens=event.context_tokens,
                context_tool_tokens=event.context_tool_tokens,
                context_start_seq=event.context_start_seq,
                summary_seq=event.summary_seq,
                pinned_seqs=event.pinned_seqs,
                compaction_count=event.compaction_count,
                reported_prompt_tokens=None,
                context_tokens_at_report=None,
                prune_checked_tool_tokens=None,
                prune_checked_urgent=None,
            )
        case Patched(config):
            return replace(
                totals,
                version=version,
                prune_checked_tool_tokens=None if config else totals.prune_checked_tool_tokens,
            )
