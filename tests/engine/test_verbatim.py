"""The verbatim_first compaction policy (app/engine/compaction/verbatim.py, and
prepare.with_policy): tool outputs leave one-line pointers, user and assistant text
stays as written, newest first, within a capped share; the rest is summarized."""

from __future__ import annotations

import orjson

from app.engine.accounting.tokens import count_entry, count_text
from app.engine.compaction import prepare as engine
from app.engine.compaction import verbatim
from app.engine.compaction.extractive import extractive_summary
from app.engine.model import Entry, Part


def _text(role: str, text: str) -> Entry:
    return Entry(role=role, parts=[{"type": "text", "text": text}])  # type: ignore[arg-type]


def _call(call_id: str, command: str, text: str = "") -> Entry:
    parts: list[Part] = [{"type": "text", "text": text}] if text else []
    parts.append(
        {
            "type": "tool_call",
            "id": call_id,
            "name": "bash",
            "arguments": orjson.dumps({"command": command}).decode(),
        }
    )
    return Entry(role="assistant", parts=parts)


def _result(call_id: str, text: str, *, is_error: bool = False) -> Entry:
    return Entry(
        role="tool",
        parts=[{"type": "text", "text": text}],
        tool_call_id=call_id,
        tool_name="bash",
        is_error=is_error,
    )


def _round(n: int, seq: int) -> list[tuple[int, Entry]]:
    """One user request, an assistant reply with a call, its (long) output."""
    return [
        (seq, _text("user", f"Request {n}: fix the parser_{n} bug in src/mod_{n}.py please")),
        (seq + 1, _call(f"c{n}", f"pytest -q tests/test_mod_{n}.py\necho done", f"Looking at {n}")),
        (seq + 2, _result(f"c{n}", "\n".join(f"line {i} of output {n}" for i in range(200)))),
        (seq + 3, _text("assistant", f"Round {n} done: parser_{n} fixed, 12 passed.")),
    ]


def _history(rounds: int, start: int = 1) -> list[tuple[int, Entry]]:
    out: list[tuple[int, Entry]] = []
    for n in range(rounds):
        out += _round(start // 4 + n, start + 4 * n)
    for _, entry in out:
        entry.tokens = count_entry(entry)
    return out


def count(text: str) -> int:
    return count_text(text)


def test_each_tool_output_leaves_one_line_pointer_with_its_seq() -> None:
    entries = _history(3)
    split = verbatim.select(entries, None, 4_000, count)
    tools = [seq for seq, e in entries if e.role == "tool"]
    assert [p.seq for p in split.verbatim.pointers] == tools
    for pointer in split.verbatim.pointers:
        assert "\n" not in pointer.line
        assert pointer.line.endswith(f"history_read from_seq={pointer.seq} to_seq={pointer.seq}")
        assert "bash" in pointer.line
        assert "pytest -q tests/test_mod_" in pointer.line
        assert "chars, 200 lines" in pointer.line
    block = split.verbatim.block()
    # The outputs themselves are gone from the block and from what is summarized.
    assert "line 17 of output" not in block
    assert all(e.role != "tool" for e in split.remainder)


def test_messages_stay_verbatim_newest_first_within_the_budget() -> None:
    entries = _history(10)
    budget = 400
    split = verbatim.select(entries, None, budget, count)
    kept = [m.seq for m in split.verbatim.messages]
    assert kept, "something must fit"
    assert split.verbatim.tokens <= budget
    texts = [(seq, e) for seq, e in entries if e.role in ("user", "assistant") and e.text()]
    # The newest messages, a contiguous run up to the newest one, whole.
    assert kept == [seq for seq, _ in texts[-len(kept) :]]
    by_seq = dict(entries)
    for message in split.verbatim.messages:
        assert message.text == by_seq[message.seq].text()
        assert message.text in split.verbatim.block()
    # What did not fit is summarized: the older requests, with their calls.
    assert split.remainder_seqs
    assert max(split.remainder_seqs) < min(kept)
    assert 1 in split.remainder_seqs
    assert all(seq not in kept for seq in split.remainder_seqs)


def test_the_cap_holds_across_compactions_no_ratchet() -> None:
    budget = 600
    previous: verbatim.Verbatim | None = None
    seq = 1
    oldest_kept: list[int] = []
    for _ in range(6):
        entries = _history(4, seq)
        seq += 16
        split = verbatim.select(entries, previous, budget, count)
        v = split.verbatim
        assert 0 < v.tokens <= budget
        assert v.tokens == count(v.block())
        if previous is not None:
            # The previous block's messages that no longer fit are summarized now.
            gone = [m.seq for m in previous.messages if m.seq not in {k.seq for k in v.messages}]
            assert gone
            assert set(gone) <= set(split.remainder_seqs)
            # Its older pointers are counted, not listed.
            assert v.omitted > 0
            assert v.omitted_from is not None
        oldest_kept.append(min(m.seq for m in v.messages))
        previous = verbatim.Verbatim.from_details({"verbatim": v.to_details()})
    # The block moves on with the history instead of holding the old text forever.
    assert oldest_kept == sorted(oldest_kept)
    assert oldest_kept[-1] > oldest_kept[0]


def test_the_latest_request_steers_older_messages_in() -> None:
    entries = _history(8)
    # An early message that shares the latest request's distinctive terms.
    entries[0] = (1, _text("user", "Remember: frobnicate_widget in src/widget_core.py must stay"))
    steer = "Now change frobnicate_widget in src/widget_core.py"
    plain = verbatim.select(entries, None, 500, count)
    steered = verbatim.select(entries, None, 500, count, steer=steer)
    assert 1 not in [m.seq for m in plain.verbatim.messages]
    assert 1 in [m.seq for m in steered.verbatim.messages]
    assert steered.verbatim.tokens <= 500


def test_media_never_enters_the_block() -> None:
    image: Part = {"type": "image", "source": {"kind": "base64", "data": "QUJDRA==" * 50}}
    entry = Entry(role="user", parts=[{"type": "text", "text": "see the screenshot"}, image])
    split = verbatim.select([(1, entry)], None, 1_000, count)
    assert [m.text for m in split.verbatim.messages] == ["see the screenshot"]
    assert "QUJDRA" not in split.verbatim.block()


def _sources(entries: list[tuple[int, Entry]]) -> list[engine.Source]:
    return [engine.Source(seq=seq, kind="message", entry=e) for seq, e in entries]


def test_a_plan_under_verbatim_first_summarizes_only_the_remainder() -> None:
    entries = _history(12)
    end = entries[-1][0] + 1
    plan = engine.plan(
        _sources(entries),
        start_seq=1,
        end_seq=end,
        keep=600,
        previous_details=None,
        threshold_tokens=20_000,
    )
    assert plan is not None
    ruled = engine.with_policy(
        plan,
        "verbatim_first",
        verbatim_share=0.1,
        usable_tokens=20_000,
        trigger_tokens=20_000,
        previous_details=None,
    )
    assert ruled.verbatim is not None
    assert ruled.verbatim.budget_tokens == 2_000
    assert ruled.details["policy"] == "verbatim_first"
    assert len(ruled.history) < len(plan.history) + len(plan.turn_prefix)
    assert all(e.role != "tool" for e in ruled.history)
    assert not ruled.turn_prefix
    body = extractive_summary(
        ruled.history,
        previous_summary=None,
        read_files=ruled.file_ops.read,
        modified_files=ruled.file_ops.modified,
        max_chars=ruled.summary_chars,
        first_request_quoted=ruled.first_request_quoted,
    )
    summary = engine.Draft(body, None, ruled).render()
    # The summarized remainder, then the block, then the quoted requests.
    assert summary.index(body.splitlines()[0]) < summary.index("<verbatim-history>")
    assert summary.index("</verbatim-history>") < summary.index("<user-requests>")
    assert summary.count("<verbatim-history>") == 1
    # The newest message kept is the newest summarized one that is not a tool output
    # nor a request quoted whole in <user-requests> already.
    assert plan.requests is not None
    quoted = {r.seq for r in plan.requests.quoted if not r.clipped}
    assert quoted
    assert not quoted & {m.seq for m in ruled.verbatim.messages}
    summarized = plan.history_seqs + plan.prefix_seqs
    last_kept = max(m.seq for m in ruled.verbatim.messages)
    assert last_kept == max(s for s in summarized if s % 4 != 3 and s not in quoted)
    assert not quoted & set(ruled.history_seqs)
    # Rendering again (the gate does) never stacks the block.
    again = engine.final_summary(summary, None, ruled.file_ops, kept_verbatim=ruled.verbatim)
    assert again.count("<verbatim-history>") == 1

    # The summarize policy changes nothing.
    same = engine.with_policy(
        plan,
        "summarize",
        verbatim_share=0.25,
        usable_tokens=20_000,
        trigger_tokens=20_000,
        previous_details=None,
    )
    assert same.history == plan.history
    assert same.verbatim is None


def test_the_budget_leaves_room_below_the_threshold() -> None:
    assert verbatim.budget_tokens(0.25, 100_000, trigger_tokens=90_000, committed_tokens=0) == (
        25_000
    )
    # The kept window and the requests already near the threshold: less (85% of the
    # threshold, less 500 for the summary of the rest), never negative.
    assert verbatim.budget_tokens(
        0.25, 100_000, trigger_tokens=90_000, committed_tokens=70_000
    ) == (6_000)
    assert verbatim.budget_tokens(0.5, 10_000, trigger_tokens=8_000, committed_tokens=9_000) == 0


def test_a_failed_outputs_pointer_quotes_what_went_wrong() -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/repo/analyze_fix.py", line 12, in <module>\n'
        "    main()\n"
        "NameError: name 'parse_row' is not defined"
    )
    entries = [
        (1, _call("c1", "python analyze_fix.py")),
        (2, _result("c1", traceback, is_error=True)),
    ]
    (pointer,) = verbatim.select(entries, None, 2_000, count).verbatim.pointers
    assert "\n" not in pointer.line
    assert "failed: NameError: name 'parse_row' is not defined" in pointer.line
    assert pointer.line.endswith("history_read from_seq=2 to_seq=2")

    # With newer outputs that crowd the pointers' room, the failure's line stays.
    later = _history(6, 3)
    crowded = verbatim.select([*entries, *later], None, 600, count).verbatim
    assert 2 in [p.seq for p in crowded.pointers]
    assert crowded.omitted > 0
    assert crowded.tokens <= 600


def test_a_syntax_errors_pointer_says_where_and_a_tool_error_its_first_line() -> None:
    syntax = '  File "/repo/fix.py", line 14\n    def f(:\n          ^\nSyntaxError: invalid syntax'
    entries = [
        (1, _call("c1", "python fix.py")),
        (2, _result("c1", syntax, is_error=True)),
        (3, _call("c2", "cat missing.txt")),
        (4, _result("c2", "\nError: ImportError: cannot import name 'x'\nmore", is_error=True)),
    ]
    first, second = verbatim.select(entries, None, 2_000, count).verbatim.pointers
    assert "failed: SyntaxError: invalid syntax" in first.line
    assert 'File "/repo/fix.py", line 14' in first.line
    assert "failed: Error: ImportError: cannot import name 'x';" in second.line


def test_without_room_for_a_block_everything_is_summarized() -> None:
    entries = _history(12)
    plan = engine.plan(
        _sources(entries),
        start_seq=1,
        end_seq=entries[-1][0] + 1,
        keep=600,
        previous_details=None,
        threshold_tokens=2_000,
    )
    assert plan is not None
    ruled = engine.with_policy(
        plan,
        "verbatim_first",
        verbatim_share=0.25,
        usable_tokens=3_000,
        trigger_tokens=1_000,
        previous_details=None,
    )
    assert ruled.verbatim is None
    assert ruled.history == plan.history
    assert any(e.role == "tool" for e in ruled.history)
    assert ruled.details["policy"] == "verbatim_first"
