"""pair_tool_calls: the model's view never holds an orphaned tool call or result."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing, pair_tool_calls
from tests.engine.strategies import call_part, messy_histories, text_part, tool_entry

PROPERTY = settings(max_examples=200, deadline=None)


def final_pending_calls(entries: list[Entry]) -> list[str]:
    """Calls of the last non-tool entry, when it is an assistant: the agent may be running them."""
    last = next((e for e in reversed(entries) if e.role != "tool"), None)
    return (
        [c["id"] for c in last.tool_calls()]
        if last is not None and last.role == "assistant"
        else []
    )


def source_of(kept: Entry, entries: list[Entry]) -> Entry:
    """The input entry ``kept`` came from: itself, or an assistant with some calls removed."""
    for e in entries:
        if kept is e:
            return e
    for e in entries:
        if e.role == "assistant" and kept.role == "assistant" and kept.extra is e.extra:
            ids = {c["id"] for c in kept.tool_calls()}
            if kept.parts == [p for p in e.parts if p["type"] != "tool_call" or p["id"] in ids]:
                return e
    raise AssertionError(f"invented entry {kept!r}")


@PROPERTY
@given(messy_histories())
def test_view_is_valid_for_both_providers(entries: list[Entry]) -> None:
    view = pair_tool_calls(entries)
    pending = final_pending_calls(entries)

    openai = [openai_format.render_message(e) for e in view]
    problems = check_openai_pairing(openai, allow_pending=False)
    if pending:
        # Only the final assistant may still wait for results.
        last_assistant = max(i for i, m in enumerate(openai) if m["role"] == "assistant")
        assert [p.index for p in problems] in ([], [last_assistant])
        assert check_openai_pairing(openai, allow_pending=True) == []
    else:
        assert problems == []

    _, anthropic = anthropic_format.render_messages(view)
    assert check_anthropic_pairing(anthropic, allow_pending=bool(pending)) == []


@PROPERTY
@given(messy_histories())
def test_view_invents_nothing_and_keeps_order(entries: list[Entry]) -> None:
    view = pair_tool_calls(entries)
    sources = [source_of(e, entries) for e in view]
    assert len({id(s) for s in sources}) == len(sources)  # nothing duplicated
    # Non-tool entries keep their relative order.
    positions = [
        next(i for i, e in enumerate(entries) if e is s) for s in sources if s.role != "tool"
    ]
    assert positions == sorted(positions)
    # Entries that carry no tool call are never dropped.
    for e in entries:
        if e.role != "tool" and not e.tool_calls():
            assert any(s is e for s in sources)


@PROPERTY
@given(messy_histories())
def test_every_kept_result_follows_its_call(entries: list[Entry]) -> None:
    view = pair_tool_calls(entries)
    owner: Entry | None = None
    answered: list[str] = []
    for e in view:
        if e.role != "tool":
            owner, answered = e, []
            continue
        assert owner is not None, "result without its call"
        assert owner.role == "assistant", "result without its call"
        assert e.tool_call_id is not None
        assert e.tool_call_id in [c["id"] for c in owner.tool_calls()]
        assert e.tool_call_id not in answered, "a call answered twice"
        answered.append(e.tool_call_id)


@PROPERTY
@given(messy_histories())
def test_answered_calls_keep_results_and_pending_calls_at_the_end_are_kept(
    entries: list[Entry],
) -> None:
    view = pair_tool_calls(entries)
    results = {e.tool_call_id for e in entries if e.role == "tool"}
    kept_calls = {c["id"] for e in view for c in e.tool_calls()}
    kept_results = {e.tool_call_id for e in view if e.role == "tool"}
    all_calls = {c["id"] for e in entries for c in e.tool_calls()}
    pending = set(final_pending_calls(entries))
    assert pending <= kept_calls
    for call_id in all_calls:
        if call_id in results:
            # An answered call is kept, with its result, unless its whole message had to go.
            assert (call_id in kept_calls) == (call_id in kept_results)
        elif call_id not in pending:
            assert call_id not in kept_calls, f"abandoned call {call_id} kept"
    assert kept_results <= all_calls


def test_pending_call_at_the_very_end_is_kept() -> None:
    user = Entry(role="user", parts=[text_part("go")])
    asking = Entry(role="assistant", parts=[call_part("a"), call_part("b")])
    answer_a = tool_entry("a")
    assert pair_tool_calls([user, asking, answer_a]) == [user, asking, answer_a]
    assert pair_tool_calls([user, asking]) == [user, asking]


def test_abandoned_call_is_dropped_but_its_text_is_kept() -> None:
    user = Entry(role="user", parts=[text_part("go")])
    asking = Entry(role="assistant", parts=[text_part("let me look"), call_part("a")])
    reasoning_only = Entry(
        role="assistant", parts=[{"type": "reasoning", "text": "x"}, call_part("b")]
    )
    later = Entry(role="user", parts=[text_part("never mind")])
    view = pair_tool_calls([user, asking, reasoning_only, later])
    assert [e.role for e in view] == ["user", "assistant", "user"]
    assert view[1].parts == [text_part("let me look")]
    assert asking.parts[1] == call_part("a")  # the input is not changed


def test_result_moves_behind_its_call_and_orphans_and_duplicates_go() -> None:
    user = Entry(role="user", parts=[text_part("go")])
    asking = Entry(role="assistant", parts=[call_part("a")])
    interjection = Entry(role="user", parts=[text_part("hurry")])
    late = tool_entry("a")
    again = tool_entry("a")
    orphan = tool_entry("zzz")
    view = pair_tool_calls([orphan, user, asking, interjection, late, again])
    assert view == [user, asking, late, interjection]
    assert view[2] is late


def _msgs(*pairs: tuple[str, Any]) -> list[dict[str, Any]]:
    return [{"role": r, "content": c} for r, c in pairs]


def _after_ask(*pairs: tuple[str, Any]) -> list[dict[str, Any]]:
    """Messages after the user's opening turn (the first message must be the user's)."""
    return _msgs(("user", "do it"), *pairs)


def test_anthropic_check_finds_real_problems() -> None:
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": "ok"}
    text = {"type": "text", "text": "hi"}
    assert check_anthropic_pairing(_after_ask(("assistant", [use]), ("user", [result]))) == []
    assert check_anthropic_pairing(_after_ask(("assistant", [use]), ("user", [text]))) != []
    assert check_anthropic_pairing(_msgs(("user", [result]))) != []
    assert check_anthropic_pairing(_after_ask(("assistant", [use]), ("user", [text, result]))) != []
    assert check_anthropic_pairing(_after_ask(("assistant", [use])), allow_pending=False) != []
    assert check_anthropic_pairing(_after_ask(("assistant", [use])), allow_pending=True) == []
    two = [use, {**use, "id": "u"}]
    # A partial answer is pending only while it is the last message.
    assert (
        check_anthropic_pairing(
            _after_ask(("assistant", two), ("user", [result])), allow_pending=True
        )
        == []
    )
    assert (
        check_anthropic_pairing(
            _after_ask(("assistant", two), ("user", [result])), allow_pending=False
        )
        != []
    )
    assert check_anthropic_pairing(_after_ask(("assistant", two), ("user", [result, text]))) != []
    assert (
        check_anthropic_pairing(
            _after_ask(("assistant", two), ("user", [result]), ("assistant", "x"))
        )
        != []
    )


def test_anthropic_check_wants_roles_to_alternate_from_the_user() -> None:
    ask, answer = ("user", "do it"), ("assistant", "done")
    assert check_anthropic_pairing(_msgs(ask, answer, ask)) == []
    problems = check_anthropic_pairing(_msgs(ask, ask, answer))
    assert [(p.index, p.problem) for p in problems] == [
        (1, "two user messages in a row: roles must alternate")
    ]
    assert [p.index for p in check_anthropic_pairing(_msgs(ask, answer, answer))] == [2]
    assert [p.problem for p in check_anthropic_pairing(_msgs(answer, ask))] == [
        "the first message must be the user's"
    ]
    assert [p.index for p in check_anthropic_pairing(_msgs(ask, ("system", "x")))] == [1]
    assert check_anthropic_pairing([]) == []


def test_openai_check_finds_real_problems() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]}
    ra = {"role": "tool", "tool_call_id": "a", "content": "A"}
    rb = {"role": "tool", "tool_call_id": "b", "content": "B"}
    user = {"role": "user", "content": "u"}
    assert check_openai_pairing([call, rb, ra]) == []
    assert check_openai_pairing([ra]) != []
    assert check_openai_pairing([call, ra, user]) != []
    assert check_openai_pairing([call, ra], allow_pending=False) != []
    assert check_openai_pairing([call, ra], allow_pending=True) == []
    assert check_openai_pairing([call, ra, ra, rb]) != []
    assert check_openai_pairing([call, ra, rb, {"role": "tool", "tool_call_id": "c"}]) != []
