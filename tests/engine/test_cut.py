"""find_cut: where a compaction cuts, never between a tool call and its results."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction.cut import Cut, CutItem, Cuttable, find_cut
from app.engine.model import Entry
from tests.engine.strategies import Ids, call_part, messy_histories, text_part, tool_entry

PROPERTY = settings(max_examples=300, deadline=None)


def usr(tokens: int = 100) -> CutItem:
    return CutItem("user", tokens)


def ass(*calls: str, tokens: int = 100) -> CutItem:
    return CutItem("assistant", tokens, call_ids=calls)


def tool(call_id: str, tokens: int = 100) -> CutItem:
    return CutItem("tool", tokens, tool_call_id=call_id)


def sys(tokens: int = 100) -> CutItem:
    return CutItem("system", tokens)


# --- A reference written the slow, obvious way --------------------------------------------


def answers(items: Sequence[Cuttable]) -> list[tuple[int, int]]:
    """(call entry, result entry) pairs: a result answers the latest earlier call with its id."""
    pairs = []
    for k, item in enumerate(items):
        if item.role != "tool" or item.tool_call_id is None:
            continue
        owner = max(
            (
                j
                for j in range(k)
                if items[j].role != "tool" and item.tool_call_id in items[j].call_ids
            ),
            default=None,
        )
        if owner is not None:
            pairs.append((owner, k))
    return pairs


def running(items: Sequence[Cuttable]) -> int | None:
    """The entry whose calls the agent is still running, if any."""
    last = max((i for i, item in enumerate(items) if item.role != "tool"), default=None)
    if last is None:
        return None
    answered = {items[k].tool_call_id for j, k in answers(items) if j == last}
    return last if set(items[last].call_ids) - answered else None


def is_valid(items: Sequence[Cuttable], i: int) -> bool:
    if not 0 < i <= len(items) or (i < len(items) and items[i].role == "tool"):
        return False
    if any(j < i <= k for j, k in answers(items)):
        return False
    pending = running(items)
    return pending is None or i <= pending


def candidate_of(items: Sequence[Cuttable], keep: int) -> int:
    return max(i for i in range(len(items) + 1) if sum(x.tokens for x in items[i:]) >= keep)


def is_hollow(items: Sequence[Cuttable], k: int) -> bool:
    """The view shows nothing of items[k]: a result of no call made before it, or an
    assistant none of whose calls is answered (a result answers the latest call with
    its id)."""
    item = items[k]
    if item.role == "tool":
        return not any(item.tool_call_id in x.call_ids for x in items[:k] if x.role != "tool")
    if item.role != "assistant" or not item.call_ids:
        return False
    for call_id in item.call_ids:
        for later in range(k + 1, len(items)):
            other = items[later]
            if other.role != "tool" and call_id in other.call_ids:
                break  # a newer call took the id
            if other.role == "tool" and other.tool_call_id == call_id:
                return False
    return True


def expected_first_kept(
    items: Sequence[Cuttable], keep: int, synthetic: frozenset[int] = frozenset()
) -> int:
    if sum(x.tokens for x in items) < keep:
        return 0
    stale = {i for i in synthetic if i < len(items) - 1}
    # A cut at j shows the stale prompt s first when everything in items[j:s] is hollow.
    behind = {
        j: s + 1
        for s in stale
        for j in range(s + 1)
        if all(is_hollow(items, k) for k in range(j, s))
    }
    candidate = candidate_of(items, keep)
    candidate = behind.get(candidate, candidate)
    valid = [i for i in range(1, len(items) + 1) if is_valid(items, i) and i not in behind]
    before = [i for i in valid if i <= candidate]
    after = [i for i in valid if i > candidate]
    return max(before) if before else min(after, default=0)


# --- Examples ------------------------------------------------------------------------------

# pi's picture: hdr usr ass tool usr ass tool tool ass tool (the header as a system entry).
PI = [sys(), usr(), ass("a"), tool("a"), usr(), ass("b", "c"), tool("b"), tool("c"), ass("d"),
      tool("d")]  # fmt: skip


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        # candidate 7 (300 kept) is inside the parallel batch: back to the assistant that made it
        (250, Cut(5, turn_start=4, kept_tokens=500, summarized_tokens=500)),
        (500, Cut(5, turn_start=4, kept_tokens=500, summarized_tokens=500)),
        # candidate 4 is the user message: a clean cut, no split turn
        (600, Cut(4, turn_start=None, kept_tokens=600, summarized_tokens=400)),
        # candidate 3 is a tool result: back to the assistant, splitting the first turn
        (700, Cut(2, turn_start=1, kept_tokens=800, summarized_tokens=200)),
        # candidate 9 is the last result: back to the last assistant
        (100, Cut(8, turn_start=4, kept_tokens=200, summarized_tokens=800)),
        # keep nothing: everything is summarized, the end is a valid cut
        (0, Cut(10, turn_start=None, kept_tokens=0, summarized_tokens=1000)),
        # only the header would be summarized
        (900, Cut(1, turn_start=None, kept_tokens=900, summarized_tokens=100)),
        # everything is needed (candidate 0): the nearest valid cut after it, keeping less
        (1000, Cut(1, turn_start=None, kept_tokens=900, summarized_tokens=100)),
        (1001, Cut(0, turn_start=None, kept_tokens=1000, summarized_tokens=0)),
    ],
)
def test_pi_picture(keep: int, expected: Cut) -> None:
    assert find_cut(PI, keep) == expected
    assert expected.first_kept == expected_first_kept(PI, keep)


def test_a_split_turn_keeps_its_prefix_apart_from_the_history() -> None:
    items = [usr(), ass(), usr(), ass("a"), tool("a"), ass("b"), tool("b"), ass()]
    cut = find_cut(items, 300)
    assert cut == Cut(5, turn_start=2, kept_tokens=300, summarized_tokens=500)
    assert cut.split_turn
    # history: items[:2]; turn prefix: items[2:5]


def test_a_turn_that_began_before_the_pivot_is_all_prefix() -> None:
    items = [ass("a"), tool("a"), ass("b"), tool("b"), ass()]
    cut = find_cut(items, 100)
    assert cut == Cut(4, turn_start=0, kept_tokens=100, summarized_tokens=400)
    assert cut.split_turn


def test_a_cut_at_a_user_message_splits_nothing() -> None:
    items = [usr(), ass(), usr(), ass()]
    cut = find_cut(items, 200)
    assert cut == Cut(2, turn_start=None, kept_tokens=200, summarized_tokens=200)
    assert not cut.split_turn


def test_parallel_results_stay_with_their_call_even_in_any_order() -> None:
    items = [usr(), ass("a", "b", "c"), tool("c"), tool("a"), tool("b", tokens=1000), usr()]
    # Keeping 1100 would cut at the last result: back before the assistant that made them.
    assert find_cut(items, 1100).first_kept == 1
    assert find_cut(items, 1).first_kept == 5


def test_when_nothing_valid_is_early_enough_it_cuts_later_and_keeps_less() -> None:
    items = [ass("a", "b"), tool("a"), tool("b"), usr(tokens=10)]
    cut = find_cut(items, 200)  # candidate 2 is a result, and 1 would split the batch
    assert cut == Cut(3, turn_start=None, kept_tokens=10, summarized_tokens=300)


def test_nothing_valid_at_all_summarizes_nothing() -> None:
    items = [ass("a"), tool("a"), tool("a")]  # the end is valid: everything pairs
    assert find_cut(items, 50).first_kept == 3
    pending = [ass("a", "b"), tool("a")]  # b is still running
    assert find_cut(pending, 50) == Cut(0, None, kept_tokens=200, summarized_tokens=0)


def test_calls_still_running_at_the_end_are_never_summarized() -> None:
    items = [usr(), ass("a"), tool("a"), ass("b", "c"), tool("b")]
    for keep in range(0, 600, 50):
        assert find_cut(items, keep).first_kept <= 3
    assert find_cut(items, 0) == Cut(3, turn_start=0, kept_tokens=200, summarized_tokens=300)


def test_an_abandoned_call_does_not_hold_the_cut_back() -> None:
    # "a" was never answered and the user moved on: the view drops it, it may go.
    items = [usr(), ass("a"), usr(), ass(), usr(), ass()]
    assert find_cut(items, 100).first_kept == 5
    assert find_cut(items, 0).first_kept == 6


def test_a_late_result_ties_its_call_to_everything_in_between() -> None:
    items = [usr(), ass("a"), usr(), ass(), tool("a"), usr(), ass()]
    assert find_cut(items, 400).first_kept == 1
    assert find_cut(items, 200).first_kept == 5


def test_reused_call_ids_answer_the_latest_call() -> None:
    items = [usr(), ass("x"), tool("x"), usr(), ass("x"), tool("x"), usr()]
    # The second "x" result answers the second call only: the cut at 3 is valid.
    assert find_cut(items, 400).first_kept == 3
    # A reused id still running at the end keeps its own call, not the old one.
    items = [usr(), ass("x"), tool("x"), usr(), ass("x")]
    assert find_cut(items, 0).first_kept == 4


def test_an_orphan_result_ties_nothing_but_cannot_start_the_kept_part() -> None:
    items = [usr(), ass(), tool("ghost"), ass(), usr()]
    assert find_cut(items, 250).first_kept == 1  # candidate 2 is the orphan itself
    assert find_cut(items, 150).first_kept == 3  # right after it is fine


def test_a_stray_system_entry_is_a_valid_cut_but_starts_no_turn() -> None:
    items = [usr(), ass(), sys(), ass()]
    assert find_cut(items, 200) == Cut(2, turn_start=0, kept_tokens=200, summarized_tokens=200)


def cont(tokens: int = 10) -> CutItem:
    """The "continue" prompt an automatic compaction added (a user entry)."""
    return CutItem("user", tokens)


def test_a_stale_continue_goes_with_the_summarized_part() -> None:
    items = [usr(), ass("a"), tool("a"), cont(100), ass("b"), tool("b"), ass()]
    # Without knowing it is synthetic, the cut falls right at it: it would head the kept part.
    assert find_cut(items, 400) == Cut(3, turn_start=None, kept_tokens=400, summarized_tokens=300)
    # It is stale (work followed it): it is summarized, and it starts no turn, so
    # the split turn is the one the user's own message started.
    assert find_cut(items, 400, synthetic=[3]) == Cut(
        4, turn_start=0, kept_tokens=300, summarized_tokens=400
    )
    assert find_cut(items, 300, synthetic=[3]) == Cut(
        4, turn_start=0, kept_tokens=300, summarized_tokens=400
    )
    assert find_cut(items, 300).turn_start == 3


def test_a_stale_continue_before_something_that_cannot_head_stays_inside_the_kept_part() -> None:
    items = [usr(), ass("a"), tool("a"), cont(100), tool("ghost"), ass()]
    cut = find_cut(items, 300, synthetic=[3])
    assert cut == Cut(1, turn_start=0, kept_tokens=500, summarized_tokens=100)


def test_the_latest_continue_is_not_stale() -> None:
    items = [usr(), ass("a"), tool("a"), cont(100)]
    assert find_cut(items, 100, synthetic=[3]) == Cut(
        3, turn_start=None, kept_tokens=100, summarized_tokens=300
    )


def test_empty_and_zero_token_histories() -> None:
    assert find_cut([], 0) == Cut(0, None, 0, 0)
    assert find_cut([], 10) == Cut(0, None, 0, 0)
    zeros = [usr(0), ass(tokens=0), usr(0)]
    assert find_cut(zeros, 0) == Cut(3, None, 0, 0)
    with pytest.raises(ValueError, match="negative"):
        find_cut(zeros, -1)


def test_entries_are_cuttable() -> None:
    entries = [
        Entry(role="user", parts=[text_part("hi")], tokens=10),
        Entry(role="assistant", parts=[call_part("c1"), call_part("c2")], tokens=20),
        dataclasses.replace(tool_entry("c2"), tokens=30),
        dataclasses.replace(tool_entry("c1"), tokens=40),
        Entry(role="assistant", parts=[text_part("done")], tokens=5),
    ]
    assert find_cut(entries, 5) == Cut(4, turn_start=0, kept_tokens=5, summarized_tokens=100)
    assert find_cut(entries, 10) == Cut(1, turn_start=0, kept_tokens=95, summarized_tokens=10)


def test_a_hundred_thousand_entries() -> None:
    items: list[CutItem] = []
    for t in range(20_000):
        items += [usr(7), ass(f"a{t}", f"b{t}", tokens=11), tool(f"b{t}", 50), tool(f"a{t}", 3)]
        items.append(ass(tokens=13))
    cut = find_cut(items, 1_000_000)
    assert cut.kept_tokens >= 1_000_000
    assert items[cut.first_kept].role != "tool"
    assert cut.kept_tokens + cut.summarized_tokens == 84 * 20_000


# --- Properties over generated histories ---------------------------------------------------

TOKENS = st.one_of(st.integers(0, 50), st.integers(0, 3_000), st.sampled_from([0, 1, 100]))


@st.composite
def histories(draw: st.DrawFn) -> list[CutItem]:
    """User turns of assistant steps with parallel calls; results in any order, sometimes
    late, missing (abandoned), or still running at the end; ids sometimes reused."""
    ids = Ids("c")
    items: list[CutItem] = []
    if draw(st.booleans()):  # the turn started before the pivot
        items.append(ass(tokens=draw(TOKENS)))
    late: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 9)) == 0:
            items.append(sys(draw(TOKENS)))
        items.append(usr(draw(TOKENS)))
        for _ in range(draw(st.integers(0, 4))):
            reuse = draw(st.sampled_from(["c_1", "c_2", None, None, None]))
            calls = [reuse or ids.next()] + [ids.next() for _ in range(draw(st.integers(0, 3)))]
            items.append(ass(*calls, tokens=draw(TOKENS)))
            for cid in draw(st.permutations(calls)):
                fate = draw(st.sampled_from(["now", "now", "now", "now", "late", "never", "twice"]))
                if fate == "late":
                    late.append(cid)
                else:
                    items += [tool(cid, draw(TOKENS))] * {"now": 1, "never": 0, "twice": 2}[fate]
            if draw(st.booleans()) and late:
                items.append(tool(late.pop(), draw(TOKENS)))
        if draw(st.booleans()):
            items.append(ass(tokens=draw(TOKENS)))
        if draw(st.integers(0, 5)) == 0:
            items.append(tool("orphan", draw(TOKENS)))
    return items


@st.composite
def messy(draw: st.DrawFn) -> list[Entry]:
    """strategies.messy_histories, with token counts."""
    return [dataclasses.replace(e, tokens=draw(TOKENS)) for e in draw(messy_histories())]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Sequence[Cuttable], int]:
    items: Sequence[Cuttable] = draw(histories() | messy())
    total = sum(x.tokens for x in items)
    keep = draw(st.integers(0, total + 10) | st.sampled_from([0, total, total + 1]))
    return items, keep


@PROPERTY
@given(cases())
def test_the_cut_is_the_nearest_valid_one(case: tuple[Sequence[Cuttable], int]) -> None:
    items, keep = case
    assert find_cut(items, keep).first_kept == expected_first_kept(items, keep)


@PROPERTY
@given(cases())
def test_the_cut_never_separates_a_call_from_its_results(
    case: tuple[Sequence[Cuttable], int],
) -> None:
    items, keep = case
    cut = find_cut(items, keep)
    i = cut.first_kept
    assert 0 <= i <= len(items)
    if 0 < i < len(items):
        assert items[i].role != "tool"
    for call, result in answers(items):
        assert (call < i) == (result < i), (call, result, i)
    pending = running(items)
    if pending is not None:
        assert i <= pending


@PROPERTY
@given(cases())
def test_the_cut_keeps_enough_when_it_can(case: tuple[Sequence[Cuttable], int]) -> None:
    items, keep = case
    cut = find_cut(items, keep)
    total = sum(x.tokens for x in items)
    assert cut.kept_tokens + cut.summarized_tokens == total
    assert cut.summarized_tokens == sum(x.tokens for x in items[: cut.first_kept])
    if total < keep:
        assert cut.first_kept == 0
        return
    candidate = candidate_of(items, keep)
    if any(is_valid(items, i) for i in range(1, candidate + 1)):
        assert cut.kept_tokens >= keep
        assert 0 < cut.first_kept <= candidate
    elif cut.first_kept:
        assert cut.first_kept > candidate


@PROPERTY
@given(cases())
def test_the_split_turn_is_described_exactly(case: tuple[Sequence[Cuttable], int]) -> None:
    items, keep = case
    cut = find_cut(items, keep)
    i = cut.first_kept
    if i == 0 or i == len(items) or items[i].role == "user":
        assert cut.turn_start is None
        assert not cut.split_turn
        return
    assert cut.split_turn
    start = cut.turn_start
    assert start is not None
    assert 0 <= start < i
    assert all(x.role != "user" for x in items[start + 1 : i])
    if items[start].role != "user":
        assert start == 0
        assert all(x.role != "user" for x in items[:i])


@st.composite
def with_continues(draw: st.DrawFn) -> tuple[Sequence[Cuttable], int, frozenset[int]]:
    """Cases with "continue" prompts of earlier compactions anywhere, often the last entry."""
    items, keep = draw(cases())
    marked = [(item, False) for item in items]
    for _ in range(draw(st.integers(1, 3))):
        marked.insert(draw(st.integers(0, len(marked))), (cont(draw(TOKENS)), True))
    if draw(st.booleans()):
        marked.append((cont(draw(TOKENS)), True))
    synthetic = frozenset(i for i, (_, is_continue) in enumerate(marked) if is_continue)
    return [item for item, _ in marked], keep, synthetic


@PROPERTY
@given(with_continues())
def test_a_stale_continue_never_heads_the_kept_part(
    case: tuple[Sequence[Cuttable], int, frozenset[int]],
) -> None:
    items, keep, synthetic = case
    cut = find_cut(items, keep, synthetic=synthetic)
    i = cut.first_kept
    assert i == expected_first_kept(items, keep, synthetic)
    if i and i in synthetic:
        assert i == len(items) - 1  # only the latest prompt may head what is kept
    # Still never between a call and its results, nor before a running call.
    for call, result in answers(items):
        assert (call < i) == (result < i), (call, result, i)
    pending = running(items)
    if pending is not None and i:
        assert i <= pending
    assert cut.summarized_tokens == sum(x.tokens for x in items[:i])
    # A synthetic prompt starts no turn: the split turn starts at the user's own message.
    if cut.turn_start is not None:
        start = cut.turn_start
        assert start not in synthetic or start == 0
        assert items[start].role == "user" or start == 0
        assert all(
            x.role != "user" or k in synthetic
            for k, x in enumerate(items[start + 1 : i], start + 1)
        )
