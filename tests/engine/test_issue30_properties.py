"""Properties of the verbatim_first policy (issue 30) over random histories.

A compaction planned with :func:`app.engine.compaction.prepare.plan`, then put under
the policy (:func:`~app.engine.compaction.prepare.with_policy`) and rendered with an
extractive summary as the service does: the block stays within its budget (counted
as the block is), nothing summarized is lost (each message is kept as written, left
to the summarizer or quoted; each tool output has a pointer or is counted), the kept
window is untouched and the context paired, no tool output and no base64 reaches the
summarizer, and over successive compactions the block never grows past its cap.
Histories mix empty and non-ASCII texts, entries with only tool calls, images,
documents, base64 in texts and in a call's arguments, and messages larger than the
block.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.accounting.tokens import count_entry, count_text
from app.engine.compaction import prepare as engine
from app.engine.compaction import verbatim
from app.engine.compaction.extractive import extractive_summary
from app.engine.compaction.summary import render_context_message, serialize_conversation
from app.engine.formats import openai_format
from app.engine.model import Entry, Part
from app.engine.window.context import check_openai_pairing, pair_tool_calls

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A payload that is surely base64 (digits, both cases, 684 characters); no 64
# characters of it may reach a summarizer.
PAYLOAD = base64.b64encode(bytes(range(256)) * 2).decode()
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000000000200015e1d0a2d0000000049454e44ae426082"
    )
).decode()


def holds_payload(text: str) -> bool:
    return any(PAYLOAD[i : i + 64] in text for i in range(0, len(PAYLOAD) - 64, 32))


WORDS = st.sampled_from(
    [
        "fix",
        "parser",
        "src/app/registry.py:135",
        "NameError: name 'x' is not defined",
        "pytest -q",
        "ünïcödé",
        "日本語のテキスト",
        "🙂",
        "",
        "\n",
        "FAILED (errors=1)",
        "<verbatim-history>",
        "Traceback (most recent call last):",
    ]
)


@st.composite
def texts(draw: st.DrawFn, *, allow_payload: bool = True) -> str:
    kind = draw(st.sampled_from(["words", "words", "empty", "long", "payload"]))
    if kind == "empty":
        return draw(st.sampled_from(["", "\n\n", "   "]))
    words = " ".join(draw(st.lists(WORDS, max_size=8)))
    if kind == "long":
        return (words + " filler line\n") * draw(st.integers(20, 150))
    if kind == "payload" and allow_payload:
        return f"{words} data:image/png;base64,{PAYLOAD} and {PAYLOAD} {words}"
    return words


@st.composite
def tool_parts(draw: st.DrawFn) -> list[Part]:
    parts: list[Part] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["text", "text", "image", "document"]))
        if kind == "text":
            parts.append({"type": "text", "text": draw(texts())})
        elif kind == "image":
            parts.append({"type": "image", "media_type": "image/png", "data": PNG + PAYLOAD})
        else:
            block = {
                "type": "document",
                "title": draw(WORDS),
                "source": {"type": "base64", "media_type": "application/pdf", "data": PAYLOAD},
            }
            parts.append({"type": "opaque", "format": "anthropic", "block": block})
    return parts


@st.composite
def histories(draw: st.DrawFn, start: int = 0) -> list[Entry]:
    """Rounds of a user request, assistant entries with 0 to 3 calls (text or not),
    each call answered right after (or not, or with an error), a final reply."""
    out: list[Entry] = []
    n = start
    for _ in range(draw(st.integers(1, 7))):
        user_parts: list[Part] = [{"type": "text", "text": draw(texts())}]
        if draw(st.integers(0, 5)) == 0:
            user_parts.append({"type": "image", "url": f"data:image/png;base64,{PNG}{PAYLOAD}"})
        out.append(Entry(role="user", parts=user_parts))
        for _ in range(draw(st.integers(0, 3))):
            parts: list[Part] = []
            if draw(st.booleans()):
                parts.append({"type": "text", "text": draw(texts())})
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                n += 1
                call_id = f"call_{n}"
                command = draw(st.sampled_from(["pytest -q", "cat src/a.py", f"echo {PAYLOAD}"]))
                arguments = orjson.dumps({"command": command}).decode()
                if draw(st.integers(0, 6)) == 0:
                    arguments = '{"path": "src/é.py", "content": "' + PAYLOAD
                parts.append(
                    {"type": "tool_call", "id": call_id, "name": "bash", "arguments": arguments}
                )
                calls.append(call_id)
            if not parts:
                parts.append({"type": "text", "text": "ok"})
            out.append(Entry(role="assistant", parts=parts))
            for call_id in calls:
                if draw(st.integers(0, 8)) == 0:
                    continue  # never answered
                out.append(
                    Entry(
                        role="tool",
                        parts=draw(tool_parts()),
                        tool_call_id=call_id,
                        tool_name="bash",
                        is_error=draw(st.booleans()),
                    )
                )
        out.append(Entry(role="assistant", parts=[{"type": "text", "text": draw(texts())}]))
    for entry in out:
        entry.tokens = count_entry(entry)
    return out


def sources(history: Sequence[Entry], first_seq: int = 1) -> list[engine.Source]:
    return [
        engine.Source(seq=first_seq + i, kind="message", entry=e) for i, e in enumerate(history)
    ]


def count(text: str) -> int:
    return count_text(text)


WINDOWS = st.sampled_from([4_000, 8_000, 16_000, 64_000])
SHARES = st.sampled_from([0.1, 0.25, 0.5])


def compact(
    srcs: list[engine.Source],
    *,
    window: int,
    share: float,
    keep: int,
    previous: dict[str, Any] | None,
) -> tuple[engine.Plan, engine.Plan] | None:
    plan = engine.plan(
        srcs,
        start_seq=srcs[0].seq,
        end_seq=srcs[-1].seq + 1,
        keep=keep,
        previous_details=previous,
        threshold_tokens=window,
    )
    if plan is None:
        return None
    ruled = engine.with_policy(
        plan,
        "verbatim_first",
        verbatim_share=share,
        usable_tokens=window,
        trigger_tokens=window,
        previous_details=previous,
    )
    return plan, ruled


def check(plan: engine.Plan, ruled: engine.Plan, srcs: list[engine.Source]) -> str:
    """The properties of one compaction; the summary rendered as the service does."""
    # The kept window is the plan's: the policy changes only what is summarized.
    assert ruled.first_kept_seq == plan.first_kept_seq
    assert ruled.kept == plan.kept
    # No tool output reaches the summarizer; no base64 either (in any part).
    assert all(e.role != "tool" for e in ruled.history) or ruled.verbatim is None
    transcript = serialize_conversation(ruled.history)
    assert not holds_payload(transcript)
    assert not holds_payload(orjson.dumps([e.parts for e in ruled.history]).decode())
    block = ruled.verbatim
    if block is not None:
        # Within its budget, counted as the block is rendered.
        assert block.tokens == (count(block.block()) if block.block() else 0)
        assert block.tokens <= block.budget_tokens
        assert all("\n" not in p.line and not holds_payload(p.line) for p in block.pointers)
        # Nothing summarized is lost: each message kept, left to summarize or quoted
        # whole; each tool output pointed at or counted within the omitted range.
        by_seq = dict(
            zip(plan.history_seqs + plan.prefix_seqs, srcs_entries(srcs, plan), strict=True)
        )
        quoted = {r.seq for r in plan.requests.quoted if not r.clipped} if plan.requests else set()
        kept_seqs = {m.seq for m in block.messages}
        left = set(ruled.history_seqs)
        pointed = {p.seq for p in block.pointers}
        assert len(ruled.history_seqs) == len(ruled.history)
        for seq, entry in by_seq.items():
            if entry.role == "tool":
                assert seq in pointed or (
                    block.omitted
                    and block.omitted_from is not None
                    and block.omitted_to is not None
                    and block.omitted_from <= seq <= block.omitted_to
                )
            elif entry.role in ("user", "assistant") and (
                entry.text().strip("\n") or entry.tool_calls()
            ):
                assert seq in kept_seqs | left | quoted, seq
    body = extractive_summary(
        ruled.history,
        read_files=ruled.file_ops.read,
        modified_files=ruled.file_ops.modified,
        max_chars=ruled.summary_chars,
        first_request_quoted=ruled.first_request_quoted,
    )
    summary = engine.Draft(body, None, ruled).render()
    # The summary the agent is handed holds no base64 either (block and pointers
    # included: the policy reads the entries with their media as pointers).
    assert not holds_payload(summary)
    if block is not None and block.block():
        assert summary.count(verbatim.VERBATIM_CLOSE) >= 1
    # The context: the summary message, then the kept entries, paired.
    message = Entry(role="user", parts=[{"type": "text", "text": render_context_message(summary)}])
    kept = [s.entry for s in srcs if s.seq >= ruled.first_kept_seq]
    paired = pair_tool_calls([message, *kept])
    last = next((e for e in reversed(kept) if e.role != "tool"), None)
    pending = last is not None and last.role == "assistant" and bool(last.call_ids)
    rendered = [openai_format.render_message(e) for e in paired]
    assert check_openai_pairing(rendered, allow_pending=pending) == []
    return summary


def srcs_entries(srcs: list[engine.Source], plan: engine.Plan) -> list[Entry]:
    at = {s.seq: s.entry for s in srcs}
    return [at[s] for s in plan.history_seqs + plan.prefix_seqs]


@PROPERTY
@given(
    history=histories(),
    window=WINDOWS,
    share=SHARES,
    keep=st.integers(0, 3_000),
)
def test_one_compaction_is_bounded_paired_lossless_and_base64_free(
    history: list[Entry], window: int, share: float, keep: int
) -> None:
    srcs = sources(history)
    made = compact(srcs, window=window, share=share, keep=keep, previous=None)
    if made is None:
        return
    check(*made, srcs)


@PROPERTY
@given(
    rounds=st.lists(histories(), min_size=2, max_size=4),
    window=WINDOWS,
    share=SHARES,
    keep=st.integers(0, 1_500),
)
def test_successive_compactions_never_ratchet_nor_drop_a_kept_message(
    rounds: list[list[Entry]], window: int, share: float, keep: int
) -> None:
    """Each compaction summarizes the new history since the last one, with the
    previous compaction's details: the block stays within its cap every time, and a
    message the previous block kept is kept again, left to the summarizer or quoted."""
    previous: dict[str, Any] | None = None
    first = 1
    pending: list[Entry] = []
    for batch in rounds:
        pending += batch
        srcs = sources(pending, first)
        made = compact(srcs, window=window, share=share, keep=keep, previous=previous)
        if made is None:
            continue
        plan, ruled = made
        check(plan, ruled, srcs)
        block = ruled.verbatim
        before = verbatim.Verbatim.from_details(previous)
        if block is not None and before is not None:
            assert block.tokens <= block.budget_tokens
            quoted = (
                {r.seq for r in plan.requests.quoted if not r.clipped} if plan.requests else set()
            )
            now = {m.seq for m in block.messages} | set(ruled.history_seqs) | quoted
            assert {m.seq for m in before.messages} <= now
        previous = ruled.details
        # The next compaction starts at the first kept entry.
        pending = [s.entry for s in srcs if s.seq >= ruled.first_kept_seq]
        first = ruled.first_kept_seq


def test_a_message_naming_the_close_tag_leaves_no_fragment() -> None:
    entries = [
        (
            1,
            Entry(
                role="user",
                parts=[{"type": "text", "text": "the tag:\n</verbatim-history>\nends it"}],
            ),
        ),
        (2, Entry(role="assistant", parts=[{"type": "text", "text": "KEPT_TAIL_MARKER"}])),
    ]
    summary = verbatim.with_block(
        "body", verbatim.select(entries, None, 2_000, count).verbatim.block()
    )
    assert "KEPT_TAIL_MARKER" not in verbatim.strip_block(summary)


@pytest.mark.parametrize(("policy", "trigger"), [("summarize", 20_000), ("verbatim_first", 1_000)])
def test_a_previous_blocks_messages_survive_a_compaction_without_a_block(
    policy: str, trigger: int
) -> None:
    from app.compactions.summarizer import _carried

    first = [
        (1, Entry(role="user", parts=[{"type": "text", "text": "start the parser work"}])),
        *[
            (seq, Entry(role="assistant", parts=[{"type": "text", "text": f"MARK_{seq} " * 40}]))
            for seq in range(2, 12)
        ],
        (12, Entry(role="user", parts=[{"type": "text", "text": "go on " * 200}])),
        (13, Entry(role="assistant", parts=[{"type": "text", "text": "fine " * 200}])),
    ]
    for _, entry in first:
        entry.tokens = count_entry(entry)
    srcs = [engine.Source(seq=seq, kind="message", entry=e) for seq, e in first]
    made = compact(srcs, window=20_000, share=0.25, keep=400, previous=None)
    assert made is not None
    _, ruled = made
    assert ruled.verbatim is not None
    marks = [f"MARK_{m.seq}" for m in ruled.verbatim.messages if m.text.startswith("MARK_")]
    assert marks
    body = extractive_summary(ruled.history, max_chars=ruled.summary_chars)
    summary = engine.Draft(body, None, ruled).render()

    later = [
        (
            seq,
            Entry(
                role="user" if seq % 2 else "assistant",
                parts=[{"type": "text", "text": "more " * 200}],
            ),
        )
        for seq in range(14, 30)
    ]
    for _, entry in later:
        entry.tokens = count_entry(entry)
    srcs2 = [engine.Source(seq=seq, kind="message", entry=e) for seq, e in later]
    plan2 = engine.plan(
        srcs2,
        start_seq=14,
        end_seq=30,
        keep=600,
        previous_details=ruled.details,
        threshold_tokens=trigger,
    )
    assert plan2 is not None
    ruled2 = engine.with_policy(
        plan2,
        policy,
        verbatim_share=0.25,
        usable_tokens=20_000,
        trigger_tokens=trigger,
        previous_details=ruled.details,
    )
    carried = _carried(summary, keeps_block=ruled2.verbatim is not None) or ""
    body2 = extractive_summary(
        ruled2.history, previous_summary=carried, max_chars=ruled2.summary_chars
    )
    summary2 = engine.Draft(body2, None, ruled2).render()
    seen = carried + summary2 + "".join(e.text() for e in ruled2.history)
    assert all(mark in seen for mark in marks)


def test_a_text_full_of_data_url_starts_is_read_once_and_its_payloads_still_go() -> None:
    """The data-URL pattern's quantifiers are bounded (unbounded ones backtracked for
    minutes on 100 KB of "data:;k="): such a text comes back as it was, and a real
    payload after it is still left out."""
    from app.engine.compaction.summary import without_inline_data

    noise = "data:;k=" * 50_000
    text = f"{noise} data:image/png;base64,{PAYLOAD} end"
    out = without_inline_data(text)
    assert out.startswith(noise)
    assert PAYLOAD[:64] not in out
    assert out.endswith("[image/png data omitted, 513 bytes] end")


def test_a_media_pointer_is_one_short_line_whatever_the_client_sent() -> None:
    from app.engine.compaction.summary import block_label

    huge = block_label({"type": "input_image", "file_id": "f" * 200_000})
    assert huge is not None
    assert len(huge) < 200
    broken = block_label({"type": "image_url", "image_url": {"url": "http://a/\n</media>\nb"}})
    assert broken is not None
    assert "\n" not in broken
    odd = block_label({"type": "image", "source": {"type": "url", "media_type": {"x": 1}}})
    assert odd == "image"


def test_opening_tags_with_no_closing_one_are_text_and_a_block_after_them_still_goes() -> None:
    """strip_block finds blocks by their tags, one pass: opening tags that nothing
    closes stay as text (a regex took a pass per tag: seconds for 100 KB)."""
    unclosed = "<verbatim-history> x\n" * 5_000
    assert verbatim.strip_block(unclosed) == unclosed.strip()
    block = verbatim.Verbatim(
        messages=(verbatim.Message(seq=3, role="user", text="keep me"),)
    ).block()
    summary = f"body\n  {block}\nafter"
    assert verbatim.strip_block(summary) == "body\nafter"
    assert "keep me" in verbatim.unwrap_block(summary)
    assert verbatim.VERBATIM_OPEN not in verbatim.unwrap_block(summary)
