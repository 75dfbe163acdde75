"""The pruning planner: which old tool outputs to hide from the model."""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.window.prune import Item, PrunePlan, PruneSettings, apply, plan_prune

# --- Generated sessions ------------------------------------------------------------------

TOOL_NAMES = st.sampled_from(
    ["read", "bash", "grep", "edit", "skill", "Skill", "SKILL", "tool-search", "Tool-X", None]
)
TOOL_TOKENS = st.one_of(
    st.integers(0, 30),  # around the placeholder
    st.integers(0, 3_000),
    st.integers(1_000, 60_000),
    st.sampled_from([0, 10, 11, 20_000, 40_000, 60_000]),
)
TEXT_TOKENS = st.integers(0, 800)


@st.composite
def sessions(draw: st.DrawFn) -> list[Item]:
    """A view: an optional pivot and system prompt, then user turns of assistant steps
    with tool results; sometimes an earlier prune or a pivot left in the middle."""
    seqs = itertools.count(draw(st.integers(1, 1_000)))
    items: list[Item] = []

    def add(role: str, tokens: int, kind: str = "message", tool_name: str | None = None) -> None:
        items.append(Item(next(seqs), role, kind, tool_name, tokens))

    if draw(st.booleans()):
        add(draw(st.sampled_from(["user", "assistant"])), draw(TEXT_TOKENS), kind="summary")
    if draw(st.booleans()):
        add(draw(st.sampled_from(["system", "developer"])), draw(TEXT_TOKENS))
    for _ in range(draw(st.integers(0, 6))):
        add("user", draw(TEXT_TOKENS))
        for _ in range(draw(st.integers(0, 4))):
            add("assistant", draw(TEXT_TOKENS))  # its tool calls
            for _ in range(draw(st.integers(0, 3))):
                add("tool", draw(TOOL_TOKENS), tool_name=draw(TOOL_NAMES))
        if draw(st.booleans()):
            add("assistant", draw(TEXT_TOKENS))  # the answer

    if items:
        marks = st.tuples(st.integers(0, len(items) - 1), st.sampled_from(["pruned", "summary"]))
        for at, mark in draw(st.lists(marks, max_size=2)):
            if mark == "pruned":
                items[at] = dataclasses.replace(
                    items[at], pruned=True, tokens=draw(st.integers(0, 30))
                )
            else:
                items[at] = dataclasses.replace(items[at], kind="summary", tool_name=None)
    return items


@st.composite
def prune_settings(draw: st.DrawFn) -> PruneSettings:
    return PruneSettings(
        protect_tokens=draw(st.sampled_from([0, 40_000]) | st.integers(0, 120_000)),
        minimum_tokens=draw(st.sampled_from([0, 20_000]) | st.integers(0, 60_000)),
        protect_turns=draw(st.integers(0, 4)),
        protected_tools=draw(
            st.frozensets(
                st.sampled_from(["skill", "Skill", "BASH", "todo", "tool-*", "[bg]rep", "re?d"]),
                max_size=3,
            )
        ),
        placeholder_tokens=draw(st.sampled_from([0, 10]) | st.integers(0, 40)),
    )


# --- An independent reading of the rules, index by index ----------------------------------


def boundary(items: list[Item]) -> int:
    """The newest summary pivot or already-pruned entry; -1 when there is none."""
    return max((i for i, it in enumerate(items) if it.kind == "summary" or it.pruned), default=-1)


def turn_start(items: list[Item], turns: int) -> int:
    """Where the last ``turns`` user turns start: nothing from there on is touched."""
    if turns == 0:
        return len(items)
    start = boundary(items) + 1
    users = [i for i in range(start, len(items)) if items[i].role == "user"]
    return users[-turns] if len(users) >= turns else start


def shielded(tool_name: str | None, settings: PruneSettings) -> bool:
    """The tool is named in ``protected_tools`` or matches one of its patterns."""
    if tool_name is None:
        return False
    return any(
        fnmatch.fnmatchcase(tool_name.casefold(), entry.casefold())
        for entry in settings.protected_tools
    )


def counted(item: Item, settings: PruneSettings) -> bool:
    """A tool output that counts toward the protection budget (and may be pruned)."""
    return item.role == "tool" and not shielded(item.tool_name, settings)


def newer_tool_tokens(items: list[Item], i: int, settings: PruneSettings) -> int:
    return sum(it.tokens for it in items[i + 1 :] if counted(it, settings))


def eligible(items: list[Item], settings: PruneSettings) -> tuple[list[int], int]:
    """The entries the rules allow to prune and what pruning them all would save."""
    cut = turn_start(items, settings.protect_turns)
    seqs = [
        it.seq
        for i, it in enumerate(items)
        if boundary(items) < i < cut
        and counted(it, settings)
        and it.tokens > settings.placeholder_tokens
        and newer_tool_tokens(items, i, settings) >= settings.protect_tokens
    ]
    tokens = {it.seq: it.tokens for it in items}
    return seqs, sum(tokens[s] - settings.placeholder_tokens for s in seqs)


def total(items: list[Item]) -> int:
    return sum(it.tokens for it in items)


# --- Properties ----------------------------------------------------------------------------


@given(sessions(), prune_settings())
def test_planning_again_after_apply_prunes_nothing(
    items: list[Item], settings: PruneSettings
) -> None:
    plan = plan_prune(items, settings)
    after = apply(items, plan, settings.placeholder_tokens)
    again = plan_prune(after, settings)
    assert again.seqs == ()
    assert again.tokens_saved == 0
    assert apply(after, again, settings.placeholder_tokens) == after


@given(sessions(), prune_settings())
def test_never_prunes_what_is_protected(items: list[Item], settings: PruneSettings) -> None:
    plan = plan_prune(items, settings)
    at = {it.seq: i for i, it in enumerate(items)}
    cut = turn_start(items, settings.protect_turns)
    for seq in plan.seqs:
        i = at[seq]
        item = items[i]
        assert item.role == "tool"
        assert item.kind == "message"
        assert not item.pruned
        assert not shielded(item.tool_name, settings)
        assert item.tokens > settings.placeholder_tokens
        assert i < cut, "inside the last protect_turns user turns"
        assert newer_tool_tokens(items, i, settings) >= settings.protect_tokens


@given(sessions(), prune_settings())
def test_saves_at_least_the_minimum_and_reports_it_exactly(
    items: list[Item], settings: PruneSettings
) -> None:
    plan = plan_prune(items, settings)
    tokens = {it.seq: it.tokens for it in items}
    assert plan.tokens_saved == sum(tokens[s] - settings.placeholder_tokens for s in plan.seqs)
    assert list(plan.seqs) == sorted(set(plan.seqs)), "oldest first, once each"
    assert (plan.reason is None) == bool(plan.seqs)
    if plan.seqs:
        assert plan.tokens_saved >= settings.minimum_tokens
        assert plan.tokens_saved == plan.candidate_tokens
    else:
        assert plan.tokens_saved == 0
        assert plan.candidate_tokens < max(1, settings.minimum_tokens)
    # candidate_tokens is what a minimum of 0 would save.
    unbounded = plan_prune(items, dataclasses.replace(settings, minimum_tokens=0))
    assert unbounded.tokens_saved == plan.candidate_tokens


@given(sessions(), prune_settings())
def test_totals_after_apply_drop_by_tokens_saved(
    items: list[Item], settings: PruneSettings
) -> None:
    plan = plan_prune(items, settings)
    after = apply(items, plan, settings.placeholder_tokens)
    assert total(after) == total(items) - plan.tokens_saved
    assert [it.seq for it in after] == [it.seq for it in items]
    assert {it.seq for it in after if it.pruned and not _was_pruned(items, it.seq)} == set(
        plan.seqs
    )


def _was_pruned(items: list[Item], seq: int) -> bool:
    return next(it.pruned for it in items if it.seq == seq)


@given(sessions(), prune_settings())
def test_never_prunes_behind_a_pivot_or_an_earlier_prune(
    items: list[Item], settings: PruneSettings
) -> None:
    plan = plan_prune(items, settings)
    at = {it.seq: i for i, it in enumerate(items)}
    edge = boundary(items)
    assert all(at[s] > edge for s in plan.seqs)
    assert plan.scanned == len(items) - max(edge, 0)


@given(
    sessions(),
    prune_settings(),
    st.integers(1, 60_000),
    st.integers(1, 60_000),
    st.integers(1, 3),
)
def test_monotonic_in_minimum_protection_and_turns(
    items: list[Item],
    settings: PruneSettings,
    more_minimum: int,
    more_protect: int,
    more_turns: int,
) -> None:
    base = set(plan_prune(items, settings).seqs)

    stricter = dataclasses.replace(settings, minimum_tokens=settings.minimum_tokens + more_minimum)
    seqs = set(plan_prune(items, stricter).seqs)
    assert seqs in (base, set()), "a higher minimum prunes the same or nothing"

    wider = dataclasses.replace(settings, protect_tokens=settings.protect_tokens + more_protect)
    assert set(plan_prune(items, wider).seqs) <= base

    longer = dataclasses.replace(settings, protect_turns=settings.protect_turns + more_turns)
    assert set(plan_prune(items, longer).seqs) <= base


@given(sessions(), prune_settings())
def test_prunes_exactly_what_the_rules_allow(items: list[Item], settings: PruneSettings) -> None:
    """Not only nothing protected: every eligible output goes once pruning is worth it."""
    seqs, tokens = eligible(items, settings)
    plan = plan_prune(items, settings)
    assert plan.candidate_tokens == tokens
    if not seqs:
        assert plan.reason == "nothing_prunable"
    elif tokens < settings.minimum_tokens:
        assert plan.reason == "below_minimum"
    else:
        assert plan.seqs == tuple(seqs)


@given(sessions(), prune_settings())
def test_protected_tokens_are_the_kept_tool_output(
    items: list[Item], settings: PruneSettings
) -> None:
    cut = turn_start(items, settings.protect_turns)
    kept = sum(
        it.tokens
        for i, it in enumerate(items)
        if i > boundary(items)
        and counted(it, settings)
        and (i >= cut or newer_tool_tokens(items, i, settings) < settings.protect_tokens)
    )
    assert plan_prune(items, settings).protected_tokens == kept


# --- Examples --------------------------------------------------------------------------------


class Session:
    """Builds a view entry by entry with increasing seqs."""

    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(
        self,
        role: str,
        tokens: int = 50,
        kind: str = "message",
        tool_name: str | None = None,
        pruned: bool = False,
    ) -> int:
        seq = len(self.items) + 1
        self.items.append(Item(seq, role, kind, tool_name, tokens, pruned))
        return seq

    def tool(self, tokens: int, name: str = "read", pruned: bool = False) -> int:
        self.add("assistant")  # the call
        return self.add("tool", tokens, tool_name=name, pruned=pruned)


def test_seed_defaults_with_realistic_sizes() -> None:
    """40k protected, 20k minimum, two turns: the old reads of turn one go."""
    s = Session()
    s.add("system", 1_200)
    s.add("user", 300)
    old = [s.tool(8_000) for _ in range(10)]
    s.add("user", 200)
    s.tool(8_000, "bash")
    s.tool(8_000, "grep")
    s.add("user", 100)
    s.tool(5_000)
    s.add("assistant", 400)

    plan = plan_prune(s.items, PruneSettings())
    # Newest first: 5k + 8k + 8k in the protected turns, then 8k, 8k, 8k of turn one
    # until 45k >= 40k; the 7 older reads are pruned.
    assert plan == PrunePlan(
        seqs=tuple(old[:7]),
        tokens_saved=7 * (8_000 - 10),
        candidate_tokens=7 * (8_000 - 10),
        reason=None,
        protected_tokens=45_000,
        scanned=len(s.items),
    )
    after = apply(s.items, plan, 10)
    assert total(after) == total(s.items) - 55_930
    assert plan_prune(after, PruneSettings()).reason == "nothing_prunable"


def test_below_minimum_prunes_nothing() -> None:
    s = Session()
    s.add("user")
    s.tool(15_000)
    s.tool(45_000)
    plan = plan_prune(s.items, PruneSettings(protect_turns=0))
    assert plan.seqs == ()
    assert plan.reason == "below_minimum"
    assert plan.candidate_tokens == 15_000 - 10
    assert plan.tokens_saved == 0
    assert plan_prune(s.items, PruneSettings(protect_turns=0, minimum_tokens=14_990)).seqs == (3,)


def test_empty_session() -> None:
    assert plan_prune([], PruneSettings()) == PrunePlan((), 0, 0, "nothing_prunable", 0, 0)
    assert apply([], plan_prune([], PruneSettings()), 10) == []


def test_only_user_text() -> None:
    items = [Item(i, "user", tokens=30_000) for i in range(1, 6)]
    plan = plan_prune(items, PruneSettings(protect_tokens=0, minimum_tokens=0, protect_turns=0))
    assert plan == PrunePlan((), 0, 0, "nothing_prunable", 0, 5)


def test_overshoot_protects_the_newest_output_whole() -> None:
    s = Session()
    s.add("user")
    first = s.tool(30_000)
    second = s.tool(30_000)
    newest = s.tool(60_000)
    plan = plan_prune(s.items, PruneSettings(protect_turns=0))
    assert newest not in plan.seqs
    assert plan.seqs == (first, second)
    assert plan.protected_tokens == 60_000


def test_the_output_that_crosses_the_threshold_is_kept() -> None:
    s = Session()
    s.add("user")
    older = s.tool(30_000)
    crossing = s.tool(30_000)  # 25k + 30k crosses 40k: kept
    s.tool(25_000)
    plan = plan_prune(s.items, PruneSettings(protect_turns=0))
    assert plan.seqs == (older,)
    assert crossing not in plan.seqs
    assert plan.protected_tokens == 55_000


def test_last_user_turns_are_never_touched() -> None:
    s = Session()
    s.add("user")
    old = s.tool(50_000)
    s.add("user")
    middle = s.tool(50_000)
    s.add("user")
    s.tool(50_000)
    settings = PruneSettings(protect_tokens=0, minimum_tokens=0)
    assert plan_prune(s.items, settings).seqs == (old,)
    assert plan_prune(s.items, dataclasses.replace(settings, protect_turns=1)).seqs == (
        old,
        middle,
    )
    # Fewer user messages than protected turns: the whole view is protected.
    assert plan_prune(s.items, dataclasses.replace(settings, protect_turns=4)).seqs == ()


def test_protected_tools_are_kept_and_do_not_spend_the_budget() -> None:
    s = Session()
    s.add("user")
    oldest = s.tool(30_000)
    s.tool(30_000, "Skill")  # old, yet an instruction: kept
    s.tool(30_000)
    s.tool(30_000)
    s.tool(50_000, "SKILL")  # newest; not counted toward the 40k
    plan = plan_prune(s.items, PruneSettings(protect_turns=0))
    assert plan.seqs == (oldest,)
    assert plan.protected_tokens == 60_000

    s = Session()
    s.add("user")
    s.tool(30_000, "bash")
    s.tool(30_000, "read")
    settings = PruneSettings(protect_tokens=0, protect_turns=0, protected_tools=frozenset({"BASH"}))
    assert plan_prune(s.items, settings).seqs == (5,)


def test_protected_tools_by_pattern_as_seed_000_does() -> None:
    """Seed 000 protects ``skill`` by name and every ``tool-`` tool by prefix."""
    s = Session()
    s.add("user")
    names = ["bash", "tool-search", "TOOL-Fetch", "skill", "tools-list", "mytool-x"]
    seq = {name: s.tool(30_000, name) for name in names}
    settings = PruneSettings(
        protect_tokens=0, protect_turns=0, protected_tools=frozenset({"skill", "tool-*"})
    )
    # Kept: "tool-search" (by prefix), "TOOL-Fetch" (case-insensitive, like names),
    # "skill" (by name); "tools-list" and "mytool-x" do not start with "tool-".
    assert plan_prune(s.items, settings).seqs == (
        seq["bash"],
        seq["tools-list"],
        seq["mytool-x"],
    )
    # A name is a name: "tool" protects a tool called "tool", not "tool-search".
    exact = dataclasses.replace(settings, protected_tools=frozenset({"tool"}))
    assert plan_prune(s.items, exact).seqs == tuple(seq.values())
    # ? and [...] are patterns too.
    classes = dataclasses.replace(settings, protected_tools=frozenset({"[bs]ash", "skil?"}))
    assert plan_prune(s.items, classes).seqs == tuple(
        seq[n] for n in names if n not in ("bash", "skill")
    )


def test_walk_stops_at_a_summary_pivot() -> None:
    s = Session()
    s.add("user")
    before = s.tool(50_000)  # replaced by the summary: not in the model's view anyway
    pivot = s.add("assistant", 2_000, kind="summary")
    s.add("user")
    after = (s.tool(50_000), s.tool(50_000))
    s.add("user")
    s.add("user")
    s.tool(40_000)
    plan = plan_prune(s.items, PruneSettings())
    assert plan.seqs == after
    assert before not in plan.seqs
    assert plan.scanned == len(s.items) - pivot + 1


def test_walk_stops_at_an_already_pruned_output() -> None:
    s = Session()
    s.add("user")
    untouched = s.tool(50_000)  # older than the earlier prune: settled then
    s.tool(10, pruned=True)
    s.add("user")
    fresh = s.tool(50_000)
    s.add("user")
    s.add("user")
    s.tool(40_000)
    plan = plan_prune(s.items, PruneSettings())
    assert plan.seqs == (fresh,)
    assert untouched not in plan.seqs


def test_outputs_no_bigger_than_the_placeholder_are_skipped() -> None:
    s = Session()
    s.add("user")
    tiny = s.tool(10)
    barely = s.tool(11)
    plan = plan_prune(s.items, PruneSettings(protect_tokens=0, minimum_tokens=0, protect_turns=0))
    assert tiny not in plan.seqs
    assert plan.seqs == (barely,)
    assert plan.tokens_saved == 1


def test_apply_marks_only_the_planned_entries() -> None:
    items = [Item(1, "user", tokens=5), Item(2, "tool", tool_name="read", tokens=900)]
    plan = PrunePlan((2,), 890, 890, None, 0, 2)
    assert apply(items, plan, 10) == [
        Item(1, "user", tokens=5),
        Item(2, "tool", tool_name="read", tokens=10, pruned=True),
    ]


@pytest.mark.parametrize(
    "field", ["protect_tokens", "minimum_tokens", "protect_turns", "placeholder_tokens"]
)
def test_settings_reject_negative_values(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PruneSettings(**{field: -1})  # type: ignore[arg-type]
