"""A compaction plan, rendered as the context would be: never an orphan.

Over generated histories (parallel calls, results late, missing, duplicated or
orphaned, system entries anywhere), plan a compaction and build the context
the way the service does: pinned system entries, the summary message, then the
kept entries, paired. Every call or result the full history could show, and
that the compaction kept, is still shown; the context is valid in both formats.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.engine.compaction import prepare as engine
from app.engine.compaction.summary import render_context_message
from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.engine.window.context import (
    check_anthropic_pairing,
    check_openai_pairing,
    pair_tool_calls,
    plan_pairing,
)
from tests.engine.strategies import messy_histories, text_part

PROPERTY = settings(max_examples=400, deadline=None)


def sources(history: list[Entry], tokens: list[int]) -> list[engine.Source]:
    out = []
    for i, entry in enumerate(history):
        entry.tokens = tokens[i % len(tokens)]
        out.append(engine.Source(seq=i + 1, kind="message", entry=entry))
    return out


def storable(history: list[Entry]) -> bool:
    """The service stores a result only after its call (an append naming an
    unknown call is refused): the histories it can hold."""
    seen: set[str] = set()
    for entry in history:
        orphan = (entry.tool_call_id or "").startswith("orphan")
        if entry.role == "tool" and entry.tool_call_id not in seen and not orphan:
            return False
        seen.update(entry.call_ids)
    return True


# Histories with token counts to plan over, and how much to keep.
HISTORIES = given(
    history=messy_histories(),
    tokens=st.lists(st.integers(1, 400), min_size=1, max_size=8),
    keep=st.integers(0, 1500),
)


def plan_of(srcs: list[engine.Source], keep: int) -> engine.Plan | None:
    return engine.plan(srcs, start_seq=1, end_seq=len(srcs) + 1, keep=keep, previous_details=None)


def shown(items: list[Entry]) -> set[tuple[int, str]]:
    """(object id, call id) of every call and result the pairing emits."""
    out: set[tuple[int, str]] = set()
    for step in plan_pairing(items):
        item = items[step.at]
        if item.role == "tool" and item.tool_call_id is not None:
            out.add((id(item), item.tool_call_id))
        for call in item.call_ids:
            if call not in step.drop:
                out.add((id(item), call))
    return out


@PROPERTY
@HISTORIES
def test_a_compacted_context_never_orphans(
    history: list[Entry], tokens: list[int], keep: int
) -> None:
    assume(storable(history))
    srcs = sources(history, tokens)
    plan = plan_of(srcs, keep)
    if plan is None:
        return
    pinned = [s.entry for s in srcs if s.seq in set(plan.pinned)]
    kept = [s.entry for s in srcs if s.seq >= plan.first_kept_seq]
    summary = Entry(
        role="user",
        parts=[text_part(render_context_message("what happened"))],
        content_form="string",
    )
    context = [*pinned, summary, *kept]

    # Nothing the whole history could show in the kept part is lost by the cut.
    before = shown(history)
    after = shown(context)
    kept_ids = {id(e) for e in kept}
    assert {pair for pair in before if pair[0] in kept_ids} <= after

    # No system entry is summarized; no tool result is.
    summarized = [s for s in srcs if s.seq < plan.first_kept_seq]
    assert all(s.seq in set(plan.pinned) for s in summarized if s.entry.role == "system")
    assert len(plan.history) + len(plan.turn_prefix) == sum(
        1 for s in summarized if s.entry.role != "system"
    )
    assert not kept or kept[0].role != "tool"

    # And the context, rendered, is valid for both providers.
    paired = pair_tool_calls(context)
    # The last assistant's calls may still be running (results to come).
    last = next((e for e in reversed(history) if e.role != "tool"), None)
    pending = last is not None and last.role == "assistant" and bool(last.call_ids)
    messages = [openai_format.render_message(e) for e in paired]
    assert check_openai_pairing(messages, allow_pending=pending) == []
    _, blocks = anthropic_format.render_messages(paired)
    assert check_anthropic_pairing(blocks, allow_pending=pending) == []


@PROPERTY
@HISTORIES
def test_the_split_turn_parts_are_the_summarized_entries(
    history: list[Entry], tokens: list[int], keep: int
) -> None:
    srcs = sources(history, tokens)
    plan = plan_of(srcs, keep)
    if plan is None:
        return
    summarized = [s.entry for s in srcs if s.seq < plan.first_kept_seq and s.entry.role != "system"]
    assert [*plan.history, *plan.turn_prefix] == summarized
    if plan.turn_prefix:
        # The prefix is the start of the turn the cut splits: a user message opens
        # it, or the turn began before the pivot and the history part is empty.
        assert plan.turn_prefix[0].role == "user" or not plan.history
        assert all(e.role != "user" for e in plan.turn_prefix[1:])
    assert plan.summarized_tokens + plan.kept_tokens == sum(
        s.entry.tokens for s in srcs if s.entry.role != "system"
    )


CONTINUE = "Continue if you have next steps."


@PROPERTY
@given(
    history=messy_histories(),
    tokens=st.lists(st.integers(1, 400), min_size=1, max_size=8),
    keep=st.integers(0, 1500),
    at=st.lists(st.integers(0, 100), min_size=1, max_size=3),
)
def test_a_stale_continue_never_follows_the_summary(
    history: list[Entry], tokens: list[int], keep: int, at: list[int]
) -> None:
    """Earlier automatic compactions left a compaction entry and its "continue"
    prompt in the window; a later cut never makes a stale one the first kept
    message, so the summary is never followed by an old "continue" (OpenAI) or
    by a second user turn made of one (Anthropic)."""
    assume(storable(history))
    srcs = sources(history, tokens)
    for k in sorted(at, reverse=True):
        pos = k % (len(srcs) + 1)
        prompt = Entry(role="user", parts=[text_part(CONTINUE)], content_form="string")
        prompt.tokens = 12
        earlier = Entry(role="user", parts=[text_part("an earlier summary")], tokens=50)
        srcs[pos:pos] = [
            engine.Source(seq=0, kind="compaction", entry=earlier),
            engine.Source(seq=0, kind="continue", entry=prompt),
        ]
    srcs = [engine.Source(i + 1, s.kind, s.entry) for i, s in enumerate(srcs)]
    plan = plan_of(srcs, keep)
    if plan is None:
        return
    kept = [s for s in srcs if s.seq >= plan.first_kept_seq and s.kind != "compaction"]
    messages = [s for s in kept if s.entry.role not in ("system", "developer")]
    if messages and messages[0].kind == "continue":
        assert messages[0] is messages[-1]  # only the latest prompt, nothing after it
    # The split turn never starts at a synthetic prompt.
    if plan.turn_prefix and plan.history:
        assert plan.turn_prefix[0].role == "user"
        assert plan.turn_prefix[0].text() != CONTINUE
    summary = Entry(
        role="user",
        parts=[text_part(render_context_message("what happened"))],
        content_form="string",
    )
    pinned = [s.entry for s in srcs if s.seq in set(plan.pinned)]
    paired = pair_tool_calls([*pinned, summary, *(s.entry for s in kept)])
    last = next((s.entry for s in reversed(srcs) if s.entry.role != "tool"), None)
    pending = last is not None and last.role == "assistant" and bool(last.call_ids)
    rendered = [openai_format.render_message(e) for e in paired]
    assert check_openai_pairing(rendered, allow_pending=pending) == []
    after = rendered.index(openai_format.render_message(summary)) + 1
    if after < len(rendered) - 1:
        assert rendered[after].get("content") != CONTINUE
    _, blocks = anthropic_format.render_messages(paired)
    assert check_anthropic_pairing(blocks, allow_pending=pending) == []


def test_a_summary_without_a_model_is_at_most_about_half_of_what_it_summarizes() -> None:
    """Two characters a summarized token (about half of it), never below 2,000
    characters, and the window's own cap still holds."""
    assert engine.summary_chars(100_000) == 12_000
    assert engine.summary_chars(100_000, summarized_tokens=4_400) == 8_800
    assert engine.summary_chars(100_000, summarized_tokens=300) == 2_000
    assert engine.summary_chars(10_000, summarized_tokens=50_000) == 6_000
