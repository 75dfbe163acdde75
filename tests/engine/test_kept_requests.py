"""The task survives whole (issue 14): every compaction's summary opens with the
user's requests quoted verbatim, the first one always, within a stated token
budget and clipped beyond it by whole lines that keep identifiers and errors;
entries pinned on append are never summarized; the service's own "continue" is
never taken for the user's words."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.compactions.summarizer import extractive
from app.engine.accounting import tokens
from app.engine.compaction import prepare as engine
from app.engine.compaction.fileops import FileOps
from app.engine.compaction.summary import (
    KeptRequest,
    clip_request,
    render_context_message,
    render_user_requests,
    strip_user_requests,
    with_user_requests,
)
from app.engine.model import Entry
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.engine.window.view import assemble_anthropic, assemble_openai, render_view
from tests.engine.strategies import call_part, messy_histories, text_part, tool_entry
from tests.recount import recount

CONTINUE = "Continue if you have next steps."
FIRST = (
    "Fix the failing `parse_date()` in src/dates.py: it raises ValueError on ISO week dates.\n"
    "Never edit tests/; run `pytest tests/test_dates.py::test_iso_week` when done."
)


def count(text: str) -> int:
    return tokens.count_text(text)


def message(role: str, text: str, **fields: Any) -> Entry:
    entry = Entry(role=role, parts=[text_part(text)], content_form="string", **fields)  # type: ignore[arg-type]
    entry.tokens = tokens.count_entry(entry)
    return entry


def block_of(summary: str) -> str:
    match = re.search(r"<user-requests>.*?</user-requests>", summary, re.S)
    assert match is not None, summary[:300]
    return match[0]


def quoted(summary: str) -> list[tuple[int, str]]:
    """(seq, text) of every request the summary's block quotes, in order."""
    return [
        (int(m[1]), m[2])
        for m in re.finditer(
            r'<request seq="(\d+)"[^>]*>\n(.*?)\n</request>', block_of(summary), re.S
        )
    ]


@dataclass
class Store:
    """A session's log as the service keeps it: entries by seq, the pivot, and the
    latest compaction's details. ``compact`` does what the worker does with the
    extractive summarizer: plan from the entries since the pivot, summarize,
    append the summary (and, when asked, the service's "continue")."""

    entries: list[engine.Source] = field(default_factory=list)
    start_seq: int = 1
    details: dict[str, Any] | None = None
    summary: str | None = None
    pinned_seqs: list[int] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return len(self.entries) + 1

    def add(self, entry: Entry, kind: str = "message", *, pinned: bool = False) -> int:
        seq = self.next_seq
        self.entries.append(engine.Source(seq=seq, kind=kind, entry=entry, pinned=pinned))
        return seq

    def turn(self, k: int, words: int = 60) -> None:
        """An assistant step: a call to read a file, and its long result."""
        call = {
            "type": "tool_call",
            "id": f"c{self.next_seq}",
            "name": "bash",
            "arguments": orjson.dumps({"command": f"cat src/mod{k}.py"}).decode(),
        }
        assistant = Entry(role="assistant", parts=[text_part(f"Reading module {k}."), call])
        assistant.tokens = tokens.count_entry(assistant)
        self.add(assistant)
        body = "\n".join(f"line {n}: value_{k} = {n * k}" for n in range(words))
        self.add(message("tool", body, tool_call_id=call["id"], tool_name="bash"))

    def compact(
        self,
        *,
        keep: int = 600,
        threshold: int = 20_000,
        keep_requests: int = 20_000,
        then_continue: bool = False,
    ) -> engine.Plan:
        since = [s for s in self.entries if s.seq >= self.start_seq]
        plan = engine.plan(
            since,
            start_seq=self.start_seq,
            end_seq=self.next_seq,
            keep=keep,
            previous_details=self.details,
            threshold_tokens=threshold,
            keep_requests_tokens=keep_requests,
        )
        assert plan is not None
        previous = strip_user_requests(self.summary) if self.summary is not None else None
        self.summary = extractive(plan, previous).summary
        self.add(message("user", render_context_message(self.summary)), "compaction")
        if then_continue:
            self.add(message("user", CONTINUE), "continue")
        self.start_seq = plan.first_kept_seq
        self.details = plan.details
        self.pinned_seqs = sorted(set(self.pinned_seqs) | set(plan.pinned))
        return plan


def test_the_first_request_survives_ten_compactions_verbatim() -> None:
    store = Store()
    store.add(message("system", "You are a careful coding agent."))
    first_seq = store.add(message("user", FIRST))
    asked: list[tuple[int, str]] = []
    for round_ in range(10):
        for k in range(8):
            store.turn(round_ * 8 + k)
        text = f"Now do part {round_}: handle `week_{round_}` in src/weeks.py."
        asked.append((store.add(message("user", text)), text))
        store.turn(1000 + round_)
        plan = store.compact(then_continue=True)
        assert store.summary is not None
        requests = quoted(store.summary)
        # The first request, whole, first; the one just summarized, whole, last.
        assert requests[0] == (first_seq, FIRST)
        assert f'<request seq="{first_seq}" first="true">' in store.summary
        summarized = [a for a in asked if a[0] < plan.first_kept_seq]
        if summarized:
            assert requests[-1] == summarized[-1]
        # Every quoted later request is one the user wrote, newest last.
        assert requests[1:] == summarized[len(summarized) - len(requests) + 1 :]
        # The service's own prompt is never quoted, nor read by the summarizer.
        assert CONTINUE not in block_of(store.summary)
        assert all(e.text() != CONTINUE for e in [*plan.history, *plan.turn_prefix])
        # Within its budget, as counted.
        assert plan.requests is not None
        budget = engine.requests_tokens(20_000, 20_000)
        assert count(block_of(store.summary)) == plan.requests.tokens <= budget
        details = plan.details["user_requests"]
        assert details["first"] == {
            "seq": first_seq,
            "text": FIRST,
            "clipped": False,
            "pinned": False,
        }
    assert store.details is not None
    assert store.details["user_requests"]["later"]


def test_the_budget_is_the_setting_within_15_percent_of_the_threshold() -> None:
    assert engine.requests_tokens(20_000, 200_000) == 20_000
    assert engine.requests_tokens(20_000, 12_000) == 1_800
    assert engine.requests_tokens(500, 12_000) == 500
    assert engine.requests_tokens(0, 12_000) == 0


LOG_LINES = 400
BURIED = "django.core.exceptions.ImproperlyConfigured: SECRET_KEY must not be empty"


def long_request() -> str:
    """An instruction, then a pasted log with an error buried in its middle."""
    lines = ["Please make the app start again; here is what I see:"]
    lines += [f"starting worker number {n} and waiting a little while" for n in range(LOG_LINES)]
    lines.insert(LOG_LINES // 2, BURIED)
    lines.insert(LOG_LINES // 3, "  File settings/base.py, line 12, in load_settings")
    lines.append("What should I change?")
    return "\n".join(lines)


def test_a_request_over_the_budget_is_clipped_by_whole_lines_keeping_errors_and_names() -> None:
    store = Store()
    request = long_request()
    assert count(request) > 2_000
    seq = store.add(message("user", request))
    for k in range(10):
        store.turn(k)
    store.add(message("user", "And make sure `manage.py check` passes."))
    store.turn(99)
    plan = store.compact(threshold=4_000, keep=300)  # a budget of 600 tokens (15%)
    assert store.summary is not None
    assert plan.requests is not None
    assert count(block_of(store.summary)) <= 600
    (first_seq, first), *later = quoted(store.summary)
    assert first_seq == seq
    assert f'<request seq="{seq}" first="true" clipped="true">' in store.summary
    # The instruction, the error and the named file are kept; whole lines only,
    # in their order; each omitted run is marked with its length.
    kept = first.split("\n")
    assert kept[0] == "Please make the app start again; here is what I see:"
    assert BURIED in kept
    assert "  File settings/base.py, line 12, in load_settings" in kept
    original = request.split("\n")
    position = 0
    omitted = 0
    for line in kept:
        if m := re.fullmatch(r"\[\.\.\. (\d+) lines omitted \.\.\.\]", line):
            omitted += int(m[1])
            position += int(m[1])
            continue
        assert original[position] == line
        position += 1
    assert position == len(original)
    assert omitted > 0
    # The newest request keeps its room: quoted whole after the clipped first.
    assert later == [(seq + 21, "And make sure `manage.py check` passes.")]


def test_older_requests_give_way_to_newer_ones_and_are_counted() -> None:
    store = Store()
    store.add(message("user", FIRST))
    written: list[str] = []
    for k in range(30):
        text = f"Step {k}: " + " ".join(f"word{k}_{n}" for n in range(40))
        written.append(text)
        store.add(message("user", text))
        store.turn(k, words=5)
    written.append("The last one.")
    store.add(message("user", written[-1]))
    store.turn(77)
    plan = store.compact(threshold=4_000, keep=200)  # a budget of 600 tokens (15%)
    assert plan.requests is not None
    assert store.summary is not None
    requests = [text for _, text in quoted(store.summary)]
    assert requests[0] == FIRST
    shown = requests[1:]
    # The newest ones, whole and in order; the others counted in the note.
    assert shown == written[len(written) - len(shown) :]
    assert 0 < len(shown) < len(written)
    assert plan.requests.omitted == len(written) - len(shown)
    assert f"[{plan.requests.omitted} other requests not quoted here" in store.summary
    assert count(block_of(store.summary)) <= 600


def test_no_block_when_the_budget_is_zero_yet_the_first_is_remembered() -> None:
    store = Store()
    store.add(message("user", FIRST))
    for k in range(10):
        store.turn(k)
    store.add(message("user", "Then the next part."))
    store.turn(50)
    store.compact(keep_requests=0)
    assert store.summary is not None
    assert "<user-requests>" not in store.summary
    for k in range(10):
        store.turn(100 + k)
    store.add(message("user", "One more."))
    store.turn(150)
    store.compact()
    assert store.summary is not None
    assert quoted(store.summary)[0] == (1, FIRST)


def test_the_service_prompt_is_never_taken_for_the_latest_request() -> None:
    store = Store()
    store.add(message("user", FIRST))
    for k in range(6):
        store.turn(k)
    store.compact(then_continue=True)
    for k in range(6):
        store.turn(10 + k)
    plan = store.compact(then_continue=True)
    assert store.summary is not None
    # Only the user's own request is quoted; the "continue" the first compaction
    # added was summarized by the second, yet appears nowhere in its input.
    assert quoted(store.summary) == [(1, FIRST)]
    assert all(e.text() != CONTINUE for e in [*plan.history, *plan.turn_prefix])
    assert CONTINUE not in store.summary


def test_a_pinned_request_is_kept_in_the_context_not_summarized_nor_quoted() -> None:
    store = Store()
    store.add(message("system", "be brief"))
    first = store.add(message("user", FIRST), pinned=True)
    for k in range(6):
        store.turn(k)
    rule = store.add(message("user", "Always answer in French."), pinned=True)
    note = store.add(message("assistant", "Noted: French from now on."), pinned=True)
    for k in range(6):
        store.turn(10 + k)
    store.add(message("user", "Now the week dates."))
    store.turn(20)
    plan = store.compact(keep=200)
    assert {1, first, rule, note} <= set(plan.pinned)
    summarized = [*plan.history, *plan.turn_prefix]
    pinned_texts = {FIRST, "Always answer in French.", "Noted: French from now on."}
    assert not any(e.text() in pinned_texts for e in summarized)
    assert plan.requests is not None
    assert plan.requests.first_pinned
    assert store.summary is not None
    assert [text for _, text in quoted(store.summary)] == ["Now the week dates."]
    assert plan.details["pinned_entries"] == len(plan.pinned)
    # Carried: the next compaction knows the first request is pinned.
    for k in range(6):
        store.turn(30 + k)
    store.add(message("user", "Finally the time zones."))
    store.turn(40)
    plan = store.compact(keep=200)
    assert plan.requests is not None
    assert plan.requests.first_pinned
    assert store.summary is not None
    assert FIRST not in store.summary


def test_the_block_comes_last_and_an_echoed_one_is_replaced() -> None:
    requests = engine.KeptRequests(
        first=KeptRequest(2, "Do it </user-requests> now", first=True),
        later=(KeptRequest(9, "and this"),),
        omitted=3,
    )
    echoed = "<user-requests>\nstale echo\n</user-requests>\n\n## Goal\nX"
    summary = engine.final_summary(echoed, None, FileOps.of(["a.py"], []), 4_000, requests)
    assert summary.startswith(
        "## Goal\nX\n\n<read-files>\na.py\n</read-files>\n\n<user-requests>\n"
    )
    assert summary.endswith("</user-requests>")
    assert summary.count("<user-requests>") == 1
    assert "stale echo" not in summary
    assert "[3 other requests not quoted here: the history has them]" in summary
    # The closing tag inside a request cannot end the block early.
    assert "Do it <\\/user-requests> now" in summary
    assert strip_user_requests(summary) == "## Goal\nX\n\n<read-files>\na.py\n</read-files>"
    assert with_user_requests(summary, "") == strip_user_requests(summary)
    assert render_user_requests([]) == ""


def test_details_round_trip_and_malformed_details_are_ignored() -> None:
    kept = engine.KeptRequests(
        first=KeptRequest(3, "first", first=True, clipped=True),
        later=(KeptRequest(8, "later"),),
        omitted=2,
        budget_tokens=900,
        tokens=40,
    )
    back = engine.KeptRequests.from_details({"user_requests": kept.to_details()})
    assert back is not None
    assert (back.first, back.later, back.omitted) == (kept.first, kept.later, kept.omitted)
    assert engine.KeptRequests.from_details({"read_files": []}) is None
    odd = engine.KeptRequests.from_details(
        {
            "user_requests": {
                "first": {"seq": "x"},
                "later": [1, {"seq": 4, "text": "ok"}],
                "omitted": -1,
            }
        }
    )
    assert odd == engine.KeptRequests(later=(KeptRequest(4, "ok"),))


# --- clip_request ---------------------------------------------------------------------

LINES = st.one_of(
    st.text(alphabet="abc def", max_size=60),
    st.sampled_from(
        [
            "ValueError: bad input",
            "see app/engine/compaction/cut.py",
            "call `find_cut()` first",
            "pytest FAILED tests/test_x.py::test_y",
            "",
            "plain words only here",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINES, min_size=1, max_size=80), limit=st.integers(1, 300))
def test_clip_request_stays_within_the_budget_by_whole_lines_in_order(
    lines: list[str], limit: int
) -> None:
    text = "\n".join(lines)
    clipped = clip_request(text, limit, count)
    assert count(clipped) <= limit
    if count(text) <= limit:
        assert clipped == text
        return
    if "lines omitted ...]" not in clipped:
        # No line fits whole: the head, cut to size (or nothing fits at all).
        assert clipped == "" or (clipped.endswith("…") and text.startswith(clipped[:-1]))
        return
    position = 0
    for line in clipped.split("\n"):
        if m := re.fullmatch(r"\[\.\.\. (\d+) lines omitted \.\.\.\]", line):
            position += int(m[1])
        else:
            assert lines[position] == line
            position += 1
    assert position == len(lines)


def test_clip_request_prefers_errors_and_identifiers_to_plain_lines() -> None:
    lines = ["Fix this please."] + ["just some plain words here"] * 50
    lines[25] = "TypeError: unsupported operand"
    lines[30] = "look at app/engine/compaction/summary.py"
    clipped = clip_request("\n".join(lines), 60, count).split("\n")
    assert clipped[0] == "Fix this please."
    assert "TypeError: unsupported operand" in clipped
    assert "look at app/engine/compaction/summary.py" in clipped
    assert clipped.count("just some plain words here") < 50


def test_one_long_paragraph_is_cut_to_its_head() -> None:
    text = "begin " + "lorem ipsum dolor " * 500 + " the very end"
    clipped = clip_request(text, 100, count)
    assert 90 <= count(clipped) <= 100
    assert clipped.endswith("…")
    assert text.startswith(clipped[:-1])


# --- pinned entries in a compacted context -----------------------------------------


@dataclass(frozen=True)
class Row:
    """An entry as the context read and the recount see it."""

    seq: int
    role: str
    kind: str
    tokens: int
    tool_call_id: str | None
    call_ids: tuple[str, ...]
    view_openai: str
    view_anthropic: str


def row(seq: int, kind: str, entry: Entry) -> Row:
    openai, anthropic = render_view(entry)
    return Row(
        seq, entry.role, kind, entry.tokens, entry.tool_call_id, entry.call_ids, openai, anthropic
    )


@st.composite
def pinned_histories(draw: st.DrawFn) -> tuple[list[Entry], list[bool]]:
    """Messy histories with some user and plain assistant entries pinned (what the
    append accepts to pin), and a few more user turns to pin."""
    history = draw(messy_histories())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(history)))
        history.insert(at, Entry(role="user", parts=[text_part("rule")], content_form="string"))
    pinnable = [e.role in ("user", "assistant") and not e.call_ids for e in history]
    pins = [p and draw(st.booleans()) for p in pinnable]
    return history, pins


def storable(history: list[Entry]) -> bool:
    seen: set[str] = set()
    for entry in history:
        orphan = (entry.tool_call_id or "").startswith("orphan")
        if entry.role == "tool" and entry.tool_call_id not in seen and not orphan:
            return False
        seen.update(entry.call_ids)
    return True


@settings(max_examples=400, deadline=None)
@given(
    case=pinned_histories(),
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    keep=st.integers(0, 1200),
)
def test_a_context_with_pinned_entries_is_valid_and_fully_counted(
    case: tuple[list[Entry], list[bool]], sizes: list[int], keep: int
) -> None:
    history, pins = case
    if not storable(history):
        return
    for i, entry in enumerate(history):
        entry.tokens = sizes[i % len(sizes)]
    srcs = [
        engine.Source(seq=i + 1, kind="message", entry=e, pinned=p)
        for i, (e, p) in enumerate(zip(history, pins, strict=True))
    ]
    plan = engine.plan(srcs, start_seq=1, end_seq=len(srcs) + 1, keep=keep, previous_details=None)
    if plan is None:
        return
    # Nothing pinned (or system) is summarized: each one before the cut is kept.
    summarized_ids = {id(e) for e in [*plan.history, *plan.turn_prefix]}
    for s in srcs:
        if s.pinned or s.entry.role == "system":
            assert id(s.entry) not in summarized_ids
            if s.seq < plan.first_kept_seq:
                assert s.seq in plan.pinned

    # The context as the service reads it: the pinned entries, the summary, the window.
    summary_seq = len(srcs) + 1
    body = render_context_message(
        engine.final_summary("what happened", None, plan.file_ops, 2_000, plan.requests)
    )
    summary = message("user", body)
    rows = [row(s.seq, s.kind, s.entry) for s in srcs] + [row(summary_seq, "compaction", summary)]
    by_seq = {r.seq: r for r in rows}
    context = [
        *(by_seq[s] for s in plan.pinned),
        by_seq[summary_seq],
        *(r for r in rows if plan.first_kept_seq <= r.seq < summary_seq),
    ]
    last = next((e for e in reversed(history) if e.role != "tool"), None)
    pending = last is not None and last.role == "assistant" and bool(last.call_ids)
    openai, used = assemble_openai(context)
    assert check_openai_pairing(orjson.loads(openai), allow_pending=pending) == []
    _, anthropic, used_anthropic = assemble_anthropic(context)
    assert check_anthropic_pairing(orjson.loads(anthropic), allow_pending=pending) == []
    # Every pinned entry is in what is sent.
    assert {context.index(by_seq[s]) for s in plan.pinned} <= set(used)

    # The verdict's count (the recount the pivot commits) holds the pinned entries,
    # the summary and the window: never less than what is sent.
    counted, _ = recount(rows, {}, plan.first_kept_seq, summary_seq, plan.pinned)
    assert counted == sum(r.tokens for r in context)
    assert counted >= sum(context[i].tokens for i in used)
    assert counted >= sum(context[i].tokens for i in used_anthropic)
    assert plan.requests is not None
    assert plan.requests.tokens <= plan.requests.budget_tokens


def test_a_pinned_assistant_first_still_opens_the_anthropic_view_with_the_user() -> None:
    entries = [
        message("system", "be brief"),
        message("assistant", "I will answer in French."),
        message("user", "go"),
        Entry(role="assistant", parts=[call_part("k1")], tokens=20),
        tool_entry("k1"),
        message("user", "next"),
        message("assistant", "done"),
    ]
    for e in entries:
        e.tokens = e.tokens or 20
    srcs = [
        engine.Source(seq=i + 1, kind="message", entry=e, pinned=i == 1)
        for i, e in enumerate(entries)
    ]
    plan = engine.plan(srcs, start_seq=1, end_seq=8, keep=1, previous_details=None)
    assert plan is not None
    assert plan.pinned == [1, 2]
    rows = [row(s.seq, s.kind, s.entry) for s in srcs]
    summary = row(8, "compaction", message("user", render_context_message("summary")))
    context = [rows[0], rows[1], summary, *(r for r in rows if r.seq >= plan.first_kept_seq)]
    system, body, _ = assemble_anthropic(context)
    messages = orjson.loads(body)
    assert orjson.loads(system) == [{"type": "text", "text": "be brief"}]
    assert messages[0]["role"] == "user"
    assert messages[1]["content"] == [{"type": "text", "text": "I will answer in French."}]
    assert check_anthropic_pairing(messages) == []
