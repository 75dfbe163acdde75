"""The ledger: a session's running totals, advanced event by event, always equal
to what a brute-force recount of the stored rows gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.accounting.ledger import (
    TOTALS_FIELDS,
    Added,
    Appended,
    LedgerEvent,
    Patched,
    PivotMoved,
    PruneChecked,
    Pruned,
    StaleUsageReported,
    Totals,
    UsageReported,
    apply,
    changed,
    totals_of,
)
from tests.recount import recount

ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "tool", "tool"])
TOKENS = st.integers(0, 30) | st.integers(0, 5_000)
PINNED_ROLES = ("system", "developer")


@dataclass(frozen=True)
class Row:
    """A stored ``entry`` row, as much of it as the totals read."""

    seq: int
    role: str
    kind: str
    tokens: int


@dataclass
class Store:
    """The stored rows of one session: the log, the prune marks, the pivot."""

    entries: list[Row] = field(default_factory=list)
    # seq -> (the placeholder's tokens, which prune marked it); prune 0 is the
    # zero-token mark an append puts on a result whose call a compaction cut off
    marks: dict[int, tuple[int, int]] = field(default_factory=dict)
    prunes: int = 0
    start_seq: int = 1

    @property
    def next_seq(self) -> int:
        return self.entries[-1].seq + 1 if self.entries else 1

    @property
    def summary_seq(self) -> int | None:
        return max((e.seq for e in self.entries if e.kind == "compaction"), default=None)

    @property
    def pinned(self) -> tuple[int, ...]:
        """Every compaction pins the system entries before its cut; all cuts
        together pin every one before the window."""
        return tuple(
            e.seq for e in self.entries if e.role in PINNED_ROLES and e.seq < self.start_seq
        )

    def cost(self, row: Row) -> int:
        return self.marks[row.seq][0] if row.seq in self.marks else row.tokens

    def in_context(self) -> list[Row]:
        summary = self.summary_seq
        return [
            e
            for e in self.entries
            if e.seq in self.pinned
            or (e.seq >= self.start_seq and (e.kind != "compaction" or e.seq == summary))
        ]

    def prunable(self) -> list[Row]:
        """Tool outputs of the window not pruned yet: what ``app.engine.window.prune`` walks."""
        return [
            e
            for e in self.entries
            if e.seq >= self.start_seq
            and e.kind != "compaction"
            and e.role == "tool"
            and e.seq not in self.marks
        ]


def brute_force(store: Store) -> dict[str, object]:
    """The log-derived totals, recounted from the rows alone."""
    context = store.in_context()
    summary = store.summary_seq
    return {
        "next_seq": store.next_seq,
        "entry_count": len(store.entries),
        "stored_tokens": sum(e.tokens for e in store.entries),
        "context_tokens": sum(store.cost(e) for e in context),
        "context_tool_tokens": sum(store.cost(e) for e in context if e.role == "tool"),
        "context_start_seq": store.start_seq,
        "summary_seq": summary,
        "pinned_seqs": store.pinned,
        "pruned_tokens": sum(
            e.tokens - store.marks[e.seq][0]
            for e in store.entries
            if e.seq in store.marks and store.marks[e.seq][1]
        ),
        "prune_count": len({prune for _, prune in store.marks.values() if prune}),
        "compaction_count": sum(e.kind == "compaction" for e in store.entries),
    }


def log_totals(totals: Totals) -> dict[str, object]:
    return {name: getattr(totals, name) for name in brute_force(Store())}


# --- events drawn against the rows ---------------------------------------------


def draw_append(data: st.DataObject, store: Store) -> Appended:
    new = [
        Row(store.next_seq + i, role, "message", tokens)
        for i, (role, tokens) in enumerate(
            data.draw(st.lists(st.tuples(ROLES, TOKENS), max_size=5), label="append")
        )
    ]
    store.entries.extend(new)
    # A result whose call a compaction cut off (possible once the pivot has moved) is
    # stored hidden, behind a zero-token mark.
    hidden = {
        r.seq
        for r in new
        if r.role == "tool"
        and store.start_seq > 1
        and data.draw(st.booleans(), label=f"hidden {r.seq}")
    }
    store.marks.update({seq: (0, 0) for seq in hidden})
    # An append whose request carried tools sets the overhead; most do not.
    overhead = data.draw(st.none() | TOKENS, label="append overhead")
    return Appended(
        tuple(Added(r.tokens, r.role == "tool", r.seq in hidden) for r in new), overhead
    )


def draw_prune(data: st.DataObject, store: Store) -> Pruned | PruneChecked:
    urgent = data.draw(st.booleans(), label="urgent")
    candidates = store.prunable()
    chosen = (
        data.draw(st.lists(st.sampled_from(candidates), unique=True), label="pruned")
        if candidates
        else []
    )
    if not chosen:
        return PruneChecked(urgent)
    store.prunes += 1
    saved = 0
    for row in chosen:
        # A placeholder never costs more than the output it replaces.
        placeholder = data.draw(st.integers(0, row.tokens), label="placeholder")
        store.marks[row.seq] = (placeholder, store.prunes)
        saved += row.tokens - placeholder
    return Pruned(saved, urgent)


def draw_pivot(data: st.DataObject, store: Store) -> PivotMoved:
    """A compaction: a cut at or after the pivot, the summary (and maybe a
    "continue") appended, the system entries before the cut pinned."""
    first_kept = data.draw(st.integers(store.start_seq, store.next_seq), label="cut")
    summary_seq = store.next_seq
    # The pinned entries are read before the pivot moves: those before the old
    # start are pinned already, the window's before the cut join them.
    pinned = tuple(
        sorted(
            set(store.pinned)
            | {
                e.seq
                for e in store.entries
                if e.role in PINNED_ROLES and store.start_seq <= e.seq < first_kept
            }
        )
    )
    # As the commit counts it: the kept window before the new entries exist.
    kept, kept_tool = recount(
        store.entries,
        {seq: tokens for seq, (tokens, _) in store.marks.items()},
        first_kept,
        summary_seq,
        pinned,
    )
    added = [data.draw(TOKENS, label="summary")]
    if data.draw(st.booleans(), label="continue"):
        added.append(data.draw(st.integers(0, 20), label="continue tokens"))
    kinds = ["compaction", "continue"]
    store.entries.extend(
        Row(summary_seq + i, "user", kinds[i], tokens) for i, tokens in enumerate(added)
    )
    store.start_seq = first_kept
    return PivotMoved(
        added=tuple(added),
        context_start_seq=first_kept,
        summary_seq=summary_seq,
        pinned_seqs=pinned,
        window_tokens=kept,
        window_tool_tokens=kept_tool,
    )


def draw_usage(data: st.DataObject) -> UsageReported:
    return UsageReported(
        calibration_factor=data.draw(st.floats(0.5, 2.0), label="factor"),
        overhead_tokens=data.draw(TOKENS, label="overhead"),
        reported_prompt_tokens=data.draw(st.integers(0, 200_000), label="prompt"),
        context_tokens_at_report=data.draw(st.integers(0, 200_000), label="at report"),
    )


KINDS = st.sampled_from(
    ["append", "append", "append", "prune", "prune", "usage", "stale", "pivot", "patch"]
)


def draw_event(data: st.DataObject, store: Store) -> LedgerEvent:
    kind = data.draw(KINDS, label="event")
    if kind == "append":
        return draw_append(data, store)
    if kind == "prune":
        return draw_prune(data, store)
    if kind == "usage":
        return draw_usage(data)
    if kind == "stale":
        return StaleUsageReported(data.draw(TOKENS, label="overhead"))
    if kind == "pivot":
        return draw_pivot(data, store)
    return Patched(config=data.draw(st.booleans(), label="config"))


# --- the properties -------------------------------------------------------------


def check_step(before: Totals, event: LedgerEvent, after: Totals) -> None:
    """What each event does beyond the log's totals: the version, the usage
    accounting and the prune check."""
    usage = ("calibration_factor", "overhead_tokens", "reported_prompt_tokens")
    expected = {name: getattr(before, name) for name in (*usage, "context_tokens_at_report")}
    now = {name: getattr(after, name) for name in expected}
    if isinstance(event, PruneChecked):
        assert after.version == before.version
    else:
        assert after.version == before.version + 1
    if isinstance(event, PivotMoved):
        assert after.pivot_version == after.version
        assert after.context_tokens == event.context_tokens
        expected.update(reported_prompt_tokens=None, context_tokens_at_report=None)
    else:
        assert after.pivot_version == before.pivot_version
    if isinstance(event, UsageReported):
        assert after.usage_count == before.usage_count + 1
        expected.update(
            calibration_factor=event.calibration_factor,
            overhead_tokens=event.overhead_tokens,
            reported_prompt_tokens=event.reported_prompt_tokens,
            context_tokens_at_report=event.context_tokens_at_report,
        )
    elif isinstance(event, StaleUsageReported):
        assert after.usage_count == before.usage_count + 1
        expected.update(overhead_tokens=event.overhead_tokens)
    elif isinstance(event, Appended) and event.overhead_tokens is not None:
        assert after.usage_count == before.usage_count
        expected.update(overhead_tokens=event.overhead_tokens)
    else:
        assert after.usage_count == before.usage_count
    assert now == expected

    checked = (after.prune_checked_tool_tokens, after.prune_checked_urgent)
    if isinstance(event, Pruned | PruneChecked):
        assert checked == (after.context_tool_tokens, event.urgent)
    elif isinstance(event, PivotMoved):
        assert checked == (None, None)
    elif isinstance(event, Patched) and event.config:
        assert checked == (None, before.prune_checked_urgent)
    else:
        assert checked == (before.prune_checked_tool_tokens, before.prune_checked_urgent)


@settings(max_examples=300)
@given(st.data())
def test_the_totals_always_equal_a_recount_of_the_rows(data: st.DataObject) -> None:
    store = Store()
    totals = Totals()
    assert log_totals(totals) == brute_force(store)
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        event = draw_event(data, store)
        after = apply(totals, event)
        check_step(totals, event, after)
        assert log_totals(after) == brute_force(store), event
        # The one writer updates the changed columns only: they are enough.
        update = changed(totals, after)
        assert set(update) <= set(TOTALS_FIELDS)
        assert totals_of({**dataclasses.asdict(totals), **update}) == after
        totals = after


@given(st.data())
def test_recount_is_the_sum_over_the_contexts_entries(data: st.DataObject) -> None:
    """Any rows, any marks (before the window too), any pivot: the recount is the
    sum of what each entry of the context costs, a marked one its placeholder."""
    rows = data.draw(
        st.lists(
            st.tuples(ROLES, st.sampled_from(["message", "compaction", "continue"]), TOKENS),
            max_size=30,
        )
    )
    entries = [Row(seq, role, kind, tokens) for seq, (role, kind, tokens) in enumerate(rows, 1)]
    start = data.draw(st.integers(1, len(entries) + 1))
    summaries = [e.seq for e in entries if e.kind == "compaction"]
    summary = data.draw(st.sampled_from([None, *summaries]))
    before = [e for e in entries if e.seq < start]
    pinned = data.draw(st.lists(st.sampled_from(before), unique=True)) if before else []
    marked = data.draw(st.lists(st.sampled_from(entries), unique=True)) if entries else []
    marks = {e.seq: data.draw(st.integers(0, e.tokens)) for e in marked}

    def cost(e: Row) -> int:
        return marks[e.seq] if e.seq >= start and e.seq in marks else e.tokens

    context = [
        e
        for e in entries
        if e in pinned or (e.seq >= start and (e.kind != "compaction" or e.seq == summary))
    ]
    expected = (
        sum(cost(e) for e in context),
        sum(cost(e) for e in context if e.role == "tool"),
    )
    assert recount(entries, marks, start, summary, [e.seq for e in pinned]) == expected


def test_a_prune_sets_the_check_to_the_tool_output_it_leaves() -> None:
    """As ``_PRUNED_TOTALS_SQL`` does: ``prune_checked_tool_tokens =
    context_tool_tokens - saved`` reads the row before the update."""
    totals = apply(Totals(), Appended((Added(100), Added(5_000, tool=True))))
    after = apply(totals, Pruned(4_990, urgent=True))
    assert (after.context_tokens, after.context_tool_tokens) == (110, 10)
    assert (after.prune_checked_tool_tokens, after.prune_checked_urgent) == (10, True)
    assert (after.pruned_tokens, after.prune_count, after.version) == (4_990, 1, 3)


def test_a_pivot_forgets_the_report_and_the_check_but_not_the_calibration() -> None:
    totals = apply(Totals(), Appended((Added(9_000, tool=True), Added(50))))
    totals = apply(totals, UsageReported(1.1, 300, 10_200, 9_050))
    totals = apply(totals, PruneChecked(urgent=False))
    assert totals.version == 3  # a check is no change a client sees
    moved = apply(totals, PivotMoved((120, 9), 2, 3, (), 50, 0))
    assert moved.version == moved.pivot_version == 4
    assert (moved.context_tokens, moved.context_tool_tokens) == (179, 0)
    assert (moved.next_seq, moved.entry_count, moved.stored_tokens) == (5, 4, 9_179)
    assert (moved.reported_prompt_tokens, moved.context_tokens_at_report) == (None, None)
    assert (moved.prune_checked_tool_tokens, moved.prune_checked_urgent) == (None, None)
    assert (moved.calibration_factor, moved.overhead_tokens, moved.usage_count) == (1.1, 300, 1)


def test_an_append_sets_the_overhead_only_when_its_request_said() -> None:
    totals = apply(Totals(), Appended((Added(100),), 700))
    assert (totals.overhead_tokens, totals.version, totals.context_tokens) == (700, 2, 100)
    kept = apply(totals, Appended((Added(5),)))
    assert (kept.overhead_tokens, kept.version) == (700, 3)
    cleared = apply(kept, Appended((Added(5),), 0))
    assert cleared.overhead_tokens == 0
    assert changed(kept, cleared) == {
        "version": 4,
        "next_seq": 4,
        "entry_count": 3,
        "stored_tokens": 110,
        "context_tokens": 110,
        "overhead_tokens": 0,
    }


def test_totals_of_reads_a_row_by_column_name() -> None:
    row = {name: getattr(Totals(), name) for name in TOTALS_FIELDS}
    row.update(pinned_seqs=[1, 4], summary_seq=9, model="gpt-4o")  # extra columns are ignored
    assert totals_of(row) == Totals(pinned_seqs=(1, 4), summary_seq=9)
    assert changed(Totals(), totals_of(row)) == {"pinned_seqs": [1, 4], "summary_seq": 9}


@pytest.mark.parametrize(
    "make",
    [
        lambda: Added(-1),
        lambda: Pruned(-1, urgent=False),
        lambda: UsageReported(1.0, -1, 0, 0),
        lambda: StaleUsageReported(-5),
        lambda: PivotMoved((10, -1), 1, 1, (), 0, 0),
        lambda: Appended((Added(1),), -1),
    ],
)
def test_negative_counts_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        make()


def test_a_hidden_result_is_stored_but_adds_nothing_to_the_context() -> None:
    """A tool result whose call a compaction already cut off: its tokens are stored,
    the context (which pairing leaves it out of) does not count them."""
    totals = apply(Totals(), Appended((Added(100), Added(700, tool=True))))
    after = apply(totals, Appended((Added(300, tool=True, hidden=True), Added(20))))
    assert after.stored_tokens == totals.stored_tokens + 320
    assert after.entry_count == totals.entry_count + 2
    assert after.context_tokens == totals.context_tokens + 20
    assert after.context_tool_tokens == totals.context_tool_tokens
    assert (after.pruned_tokens, after.prune_count) == (0, 0)
