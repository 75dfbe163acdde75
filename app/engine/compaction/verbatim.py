"""The ``verbatim_first`` compaction policy (docs/how-it-works.md, "Verbatim before
summary"): what of the summarized history stays as written, what leaves a pointer,
and what is left for the summarizer. Pure: no I/O, no clock.

Under this policy a compaction replaces its history in three steps:

1. Every tool output leaves first. Each leaves a one-line pointer: the tool, the
   call's command or path (clipped), the output's size, and the ``history_read``
   arguments that read it back whole (its own seq, from and to).
2. The user's and the assistant's text (text parts only: never an image or a
   document) stays as written, newest first back, whole messages, while it fits
   the verbatim budget (a share of the window's usable tokens). Optionally the
   latest user request steers: once the newest run stops fitting, older messages
   that share its distinctive terms may still be kept where they fit.
3. What still does not fit is summarized, by the session's summarizer as before.

The budget is a cap on the whole block, pointers included, and it holds across
compactions: what the previous block kept (its messages and pointers, carried in
the compaction's details) competes with the new history for the same budget, and
what no longer fits goes to the summarizer (a message) or into the count of older
tool outputs (a pointer). So the block never grows past its cap: no ratchet.

The block renders as ``<verbatim-history>``: a transcript with the messages and
the pointers in seq order, oldest first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.engine.compaction.anchors import command_of, outcome, task_terms
from app.engine.compaction.fileops import PATH_KEYS
from app.engine.model import Entry, Part, Role

POLICIES = ("summarize", "verbatim_first")

VERBATIM_OPEN = "<verbatim-history>"
VERBATIM_CLOSE = "</verbatim-history>"
VERBATIM_INTRO = (
    "The messages before the ones kept below, as written (oldest first); each older tool "
    "output is a one-line pointer, and history_read with its seqs reads it back whole."
)
_BLANK_RUNS = re.compile(r"\n{3,}")

# The pointers take at most this share of the budget; older ones are counted.
POINTER_SHARE = 0.25
# How much of the call a pointer shows (its command, or its path), in characters.
POINTER_COMMAND_CHARS = 80
FAILED_MARK = " failed: "
# How much of a failed output's error line a pointer quotes, in characters.
POINTER_ERROR_CHARS = 240
# Older messages the latest request steers in share at least this many of its terms.
STEER_MIN_TERMS = 2
# The share of the messages' room the older messages it steers in may take.
STEER_SHARE = 0.25
# The context after a compaction stays below this share of the compaction threshold;
# the summary's body keeps at least MIN_BODY_TOKENS of it (about 2,000 characters).
ROOM_SHARE = 0.85
MIN_BODY_TOKENS = 500
# A budget below this holds no block worth having: the compaction summarizes it all.
MIN_BLOCK_TOKENS = 200
# Room the block keeps for its frame and the omitted-pointers line, in tokens.
FRAME_TOKENS = 96


@dataclass(frozen=True, slots=True)
class Message:
    """A user or assistant message kept as written (its text parts)."""

    seq: int
    role: str
    text: str

    def render(self) -> str:
        return f"[{self.role} seq {self.seq}]\n{self.text}"


@dataclass(frozen=True, slots=True)
class Pointer:
    """Where a tool output that left the context is: one line."""

    seq: int
    line: str
    failed: bool = False  # the output failed: its line quotes what went wrong


@dataclass(frozen=True, slots=True)
class Verbatim:
    """The block a ``verbatim_first`` summary carries, and what the next compaction
    reads back from the details (``omitted`` older outputs between ``omitted_from``
    and ``omitted_to`` have no line of their own)."""

    messages: tuple[Message, ...] = ()
    pointers: tuple[Pointer, ...] = ()
    omitted: int = 0
    omitted_from: int | None = None
    omitted_to: int | None = None
    budget_tokens: int = 0
    tokens: int = 0  # the block's, as counted

    def block(self) -> str:
        """The ``<verbatim-history>`` block; empty when it holds nothing."""
        items: list[tuple[int, str]] = [(m.seq, m.render()) for m in self.messages]
        items += [(p.seq, p.line) for p in self.pointers]
        if not items and not self.omitted:
            return ""
        lines = [VERBATIM_OPEN, VERBATIM_INTRO]
        if self.omitted:
            lines.append(omitted_line(self.omitted, self.omitted_from, self.omitted_to))
        lines += [_escaped(text) for _, text in sorted(items, key=lambda item: item[0])]
        lines.append(VERBATIM_CLOSE)
        return "\n".join(lines)

    def to_details(self) -> dict[str, Any]:
        return {
            "messages": [{"seq": m.seq, "role": m.role, "text": m.text} for m in self.messages],
            "pointers": [{"seq": p.seq, "line": p.line, "failed": p.failed} for p in self.pointers],
            "omitted_pointers": self.omitted,
            "omitted_from": self.omitted_from,
            "omitted_to": self.omitted_to,
            "budget_tokens": self.budget_tokens,
            "tokens": self.tokens,
        }

    @classmethod
    def from_details(cls, details: Mapping[str, Any] | None) -> Verbatim | None:
        """What a compaction's details carry; None when nothing (a compaction made
        under the summarize policy). Malformed items are skipped."""
        value = details.get("verbatim") if details is not None else None
        if not isinstance(value, dict):
            return None
        messages: list[Message] = []
        for item in _list(value.get("messages")):
            seq, role, text = item.get("seq"), item.get("role"), item.get("text")
            if not (isinstance(seq, int) and _seq(seq) and isinstance(text, str)):
                continue
            if role in ("user", "assistant"):
                messages.append(Message(seq, str(role), text))
        pointers = [
            Pointer(item["seq"], item["line"], item.get("failed") is True)
            for item in _list(value.get("pointers"))
            if _seq(item.get("seq")) and isinstance(item.get("line"), str)
        ]
        omitted = value.get("omitted_pointers")
        low, high = value.get("omitted_from"), value.get("omitted_to")
        return cls(
            messages=tuple(messages),
            pointers=tuple(pointers),
            omitted=omitted if isinstance(omitted, int) and _seq(omitted) else 0,
            omitted_from=low if _seq(low) else None,
            omitted_to=high if _seq(high) else None,
        )


def _list(value: Any) -> list[dict[str, Any]]:
    return [i for i in value if isinstance(i, dict)] if isinstance(value, list) else []


def _seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def omitted_line(count: int, low: int | None, high: int | None) -> str:
    where = f" between seq {low} and {high}" if low is not None and high is not None else ""
    return (
        f"({count} older tool output{'s' if count != 1 else ''}{where} without a line here: "
        "history_search finds them, history_read reads them)"
    )


def _escaped(text: str) -> str:
    """A kept message's text (or a pointer's line) with the block's own tags made inert,
    as the user's requests are: a message that names ``</verbatim-history>`` must not
    end the block when the next compaction strips it."""
    return text.replace(VERBATIM_CLOSE, "<\\/verbatim-history>").replace(
        VERBATIM_OPEN, "<\\verbatim-history>"
    )


def unwrap_block(summary: str) -> str:
    """``summary`` with its ``<verbatim-history>`` block's messages and pointers kept
    as plain text (the tags and the intro dropped): what a summarizer reads of a
    previous summary when the new plan keeps no block of its own, so the messages the
    old block held are summarized rather than lost."""

    def plain(block: str) -> str:
        inner = block.strip().removeprefix(VERBATIM_OPEN).removesuffix(VERBATIM_CLOSE)
        inner = inner.strip().removeprefix(VERBATIM_INTRO).strip()
        return f"Kept as written by an earlier compaction:\n{inner}\n" if inner else ""

    return _BLANK_RUNS.sub("\n\n", _replace_blocks(summary, plain)).strip()


def _replace_blocks(summary: str, replace_with: Callable[[str], str]) -> str:
    """``summary`` with each block (from an opening tag to the first closing tag that
    ends its line, with the blanks before it on its line and the line's end) replaced
    by ``replace_with(block)``. By ``str.find``: a summary full of opening tags with no
    closing one costs one pass, not one pass per tag."""
    out: list[str] = []
    pos = 0
    while (start := summary.find(VERBATIM_OPEN, pos)) >= 0:
        end = summary.find(VERBATIM_CLOSE, start + len(VERBATIM_OPEN))
        while end >= 0:
            after = end + len(VERBATIM_CLOSE)
            stop = after
            while stop < len(summary) and summary[stop] in " \t":
                stop += 1
            if stop == len(summary) or summary[stop] == "\n":
                break
            end = summary.find(VERBATIM_CLOSE, after)
        if end < 0:
            break  # no closing tag after this one, nor after any later one
        lead = start
        while lead > pos and summary[lead - 1] in " \t":
            lead -= 1
        stop = min(stop + 1, len(summary))  # the line's end goes with the block
        out += [summary[pos:lead], replace_with(summary[lead:stop])]
        pos = stop
    out.append(summary[pos:])
    return "".join(out)


def strip_block(summary: str) -> str:
    """``summary`` without its ``<verbatim-history>`` block (a previous summary's:
    the new one renders its own from the details)."""
    return _BLANK_RUNS.sub("\n\n", _replace_blocks(summary, lambda _: "")).strip()


def with_block(summary: str, block: str) -> str:
    """``summary`` without any verbatim block it held, then ``block``."""
    text = strip_block(summary)
    if not block:
        return text
    return f"{text}\n\n{block}" if text else block


# --- Pointers ----------------------------------------------------------------------


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _call_subject(call: Part | None) -> str | None:
    """What a pointer names of the call: its shell command, else a path it names,
    else its first short string argument."""
    if call is None:
        return None
    command = command_of(call)
    if command:
        return command
    raw = call.get("arguments") or ""
    try:
        args = orjson.loads(raw) if isinstance(raw, str) and raw.strip() else raw
    except orjson.JSONDecodeError:
        return raw if isinstance(raw, str) and raw.strip() else None
    if not isinstance(args, dict):
        return None
    for key in (*PATH_KEYS, "paths", "pattern", "query", "url"):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return " ".join(value)
    return next((v for v in args.values() if isinstance(v, str) and v.strip()), None)


def pointer_line(seq: int, entry: Entry, call: Part | None) -> str:
    """One line for the tool output ``entry`` at ``seq`` (``call``: the call that
    asked for it, when the history holds it): the tool, what it was asked
    (clipped), the output's size, what went wrong when it failed (its error line
    as written, :func:`app.engine.compaction.anchors.outcome`), and how to read it back."""
    name = (call.get("name") if call is not None else None) or entry.tool_name or "tool"
    subject = _call_subject(call)
    what = f" `{_one_line(subject, POINTER_COMMAND_CHARS)}`" if subject else ""
    text = entry.text()
    lines = text.count("\n") + 1 if text else 0
    size = f"{len(text):,} chars, {lines:,} line{'s' if lines != 1 else ''}"
    media = sum(1 for p in entry.parts if p.get("type") != "text")
    if media:
        size += f", {media} non-text part{'s' if media != 1 else ''}"
    failed = " (error)" if entry.is_error else ""
    result = outcome(text, is_error=entry.is_error, command=command_of(call) if call else None)
    said: list[str] = []
    if result.failed and result.lines:
        # What went wrong, as written: the line an agent searches for, the last error
        # line when it is another (a runner's summary after a test's failure), and
        # where a syntax error is (its line number changes from one run to the next).
        said = [result.lines[0].text]
        said += [t for t in (result.last, result.where) if t and t not in said]
    elif entry.is_error and (first := next((ln for ln in text.splitlines() if ln.strip()), "")):
        said = [first.strip()]  # a tool's own error: its first line says it
    if said:
        failed = FAILED_MARK + " | ".join(_one_line(t, POINTER_ERROR_CHARS) for t in said)
    return (
        f"- tool output seq {seq}: {_one_line(str(name), 60)}{what}, {size}{failed}; "
        f"history_read from_seq={seq} to_seq={seq}"
    )


def pointers_of(entries: Sequence[tuple[int, Entry]]) -> list[Pointer]:
    """A pointer for each tool output among ``entries`` (seq, entry), in order."""
    calls: dict[str, Part] = {}
    for _, entry in entries:
        for part in entry.tool_calls():
            calls[str(part.get("id"))] = part
    out: list[Pointer] = []
    for seq, entry in entries:
        if entry.role == "tool":
            line = pointer_line(seq, entry, calls.get(entry.tool_call_id or ""))
            out.append(Pointer(seq, line, FAILED_MARK in line))
    return out


# --- The split ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Split:
    """What the policy makes of a compaction's history: the block, and the entries
    left for the summarizer (oldest first, with their seqs)."""

    verbatim: Verbatim
    remainder: list[Entry] = field(default_factory=list)
    remainder_seqs: tuple[int, ...] = ()


def _text_of(entry: Entry) -> str:
    """A message's text parts (never media), without its outer blank lines."""
    return entry.text().strip("\n")


def _cap_pointers(
    pointers: Sequence[Pointer],
    previous: Verbatim | None,
    room: int,
    count: Callable[[str], int],
) -> tuple[list[Pointer], int, int | None, int | None, int]:
    """The newest pointers that fit ``room`` tokens, the newest failed output's
    first; the others counted, with their seq range (a previous block's count and
    range added). And the tokens used."""
    out = list(pointers)
    chosen: set[int] = set()
    used = 0
    # The newest failure first: what went wrong last is what an agent looks for.
    failed = next((p for p in reversed(out) if p.failed), None)
    if failed is not None and (cost := count(failed.line) + 1) <= room:
        chosen.add(failed.seq)
        used += cost
    for pointer in reversed(out):
        if pointer.seq in chosen:
            continue
        cost = count(pointer.line) + 1
        if used + cost > room:
            break
        chosen.add(pointer.seq)
        used += cost
    kept = [p for p in out if p.seq in chosen]
    dropped = [p for p in out if p.seq not in chosen]
    omitted = (previous.omitted if previous else 0) + len(dropped)
    seqs = [p.seq for p in dropped]
    if previous is not None and previous.omitted:
        seqs += [s for s in (previous.omitted_from, previous.omitted_to) if s is not None]
    low, high = (min(seqs), max(seqs)) if seqs else (None, None)
    if omitted:
        used += count(omitted_line(omitted, low, high)) + 1
    return kept, omitted, low, high, used


def select(
    entries: Sequence[tuple[int, Entry]],
    previous: Verbatim | None,
    budget: int,
    count: Callable[[str], int],
    *,
    quoted: Collection[int] = (),
    steer: str | None = None,
) -> Split:
    """The policy over the summarized ``entries`` (seq, entry; oldest first), with
    the ``previous`` compaction's block, within ``budget`` tokens (``count`` counts
    them).

    ``quoted``: the seqs of user messages the summary quotes whole already (its
    ``<user-requests>`` block): not repeated, not summarized again. ``steer``: the
    latest user request; with it, :data:`STEER_SHARE` of the messages' room waits
    for older messages that share at least :data:`STEER_MIN_TERMS` of its
    distinctive terms, once the newest run stops fitting.

    The pointers come first (the newest failure's, then the newest, up to
    :data:`POINTER_SHARE` of the budget; the others counted), then the messages, newest first, whole, while
    they fit. A previous block's messages and pointers are older than the new
    history and compete for the same budget; the messages that do not fit are
    the summarizer's, before the new history's, oldest first."""
    budget = max(0, budget)
    prior_pointers = list(previous.pointers) if previous else []
    new_pointers = pointers_of(entries)
    seen = {p.seq for p in new_pointers}
    all_pointers = sorted(
        [*(p for p in prior_pointers if p.seq not in seen), *new_pointers], key=lambda p: p.seq
    )
    room = budget - FRAME_TOKENS
    pointers, omitted, low, high, used = _cap_pointers(
        all_pointers, previous, max(0, int(budget * POINTER_SHARE)), count
    )
    room -= used

    # The candidates, oldest first: the previous block's, then the new history's.
    candidates: list[tuple[Message, Entry | None]] = []
    if previous is not None:
        candidates += [(m, None) for m in previous.messages if m.seq not in quoted]
    for seq, entry in entries:
        if entry.role not in ("user", "assistant") or seq in quoted:
            continue
        text = _text_of(entry)
        if text:
            candidates.append((Message(seq, entry.role, text), entry))
    costs = [count(m.render()) + 1 for m, _ in candidates]

    keep: set[int] = set()
    stopped_at = -1
    wanted = {t.lower() for t in task_terms(steer)} if steer else set()
    # With a request to steer by, a share of the room waits for the older messages
    # that share its terms; what they leave is not used by the newest run.
    reserve = int(room * STEER_SHARE) if wanted else 0
    room -= reserve
    for index in range(len(candidates) - 1, -1, -1):
        if costs[index] > room:
            stopped_at = index
            break
        keep.add(index)
        room -= costs[index]
    room += reserve
    if wanted and stopped_at >= 0:
        for index in range(stopped_at - 1, -1, -1):
            message = candidates[index][0]
            shared = wanted & {t.lower() for t in task_terms(message.text)}
            if len(shared) >= STEER_MIN_TERMS and costs[index] <= room:
                keep.add(index)
                room -= costs[index]

    kept_messages = [m for i, (m, _) in enumerate(candidates) if i in keep]
    kept_seqs = {m.seq for m in kept_messages}
    verbatim = Verbatim(
        messages=tuple(kept_messages),
        pointers=tuple(pointers),
        omitted=omitted,
        omitted_from=low,
        omitted_to=high,
        budget_tokens=budget,
    )
    # The whole block as counted is what counts: were it over (the frame is counted
    # with room to spare), the oldest messages go to the summarizer, then pointers.
    tokens = count(verbatim.block()) if verbatim.block() else 0
    while tokens > budget and (verbatim.messages or verbatim.pointers):
        if verbatim.messages:
            kept_seqs.discard(verbatim.messages[0].seq)
            verbatim = Verbatim(
                verbatim.messages[1:],
                verbatim.pointers,
                verbatim.omitted,
                verbatim.omitted_from,
                verbatim.omitted_to,
                budget,
            )
        else:
            gone = verbatim.pointers[0].seq
            verbatim = Verbatim(
                (),
                verbatim.pointers[1:],
                verbatim.omitted + 1,
                min(gone, verbatim.omitted_from or gone),
                max(gone, verbatim.omitted_to or gone),
                budget,
            )
        tokens = count(verbatim.block()) if verbatim.block() else 0
    verbatim = Verbatim(
        verbatim.messages,
        verbatim.pointers,
        verbatim.omitted,
        verbatim.omitted_from,
        verbatim.omitted_to,
        budget,
        tokens,
    )

    # Left for the summarizer: the previous block's messages that no longer fit,
    # then the new history's user and assistant entries not kept (their tool calls
    # with them: what was done), never a tool output (its pointer stands for it).
    remainder: list[tuple[int, Entry]] = []
    for message, source in candidates:
        if source is None and message.seq not in kept_seqs:
            remainder.append((message.seq, _entry_of(message)))
    for seq, entry in entries:
        if entry.role == "tool" or seq in quoted or seq in kept_seqs:
            continue
        if entry.role in ("user", "assistant") and (_text_of(entry) or entry.tool_calls()):
            remainder.append((seq, entry))
    remainder.sort(key=lambda item: item[0])
    return Split(verbatim, [e for _, e in remainder], tuple(s for s, _ in remainder))


def _entry_of(message: Message) -> Entry:
    """A previous block's message as an entry the summarizer reads."""
    role: Role = "assistant" if message.role == "assistant" else "user"
    return Entry(role=role, parts=[{"type": "text", "text": message.text}])


def budget_tokens(
    share: float,
    usable_tokens: int,
    *,
    trigger_tokens: int,
    committed_tokens: int,
) -> int:
    """The verbatim block's budget: ``share`` of the window's usable tokens, but
    never so much that the context after the compaction would stand near the
    compaction threshold again (above :data:`ROOM_SHARE` of ``trigger_tokens``)
    with what it holds anyway (``committed_tokens``: the kept window and the quoted
    requests) and at least :data:`MIN_BODY_TOKENS` for the summary of the rest."""
    cap = int(max(0.0, share) * max(0, usable_tokens))
    return max(0, min(cap, room_tokens(trigger_tokens, committed_tokens) - MIN_BODY_TOKENS))


def room_tokens(trigger_tokens: int, committed_tokens: int) -> int:
    """What the summary may take in all (its body and the verbatim block): what is
    left below :data:`ROOM_SHARE` of the threshold by ``committed_tokens``."""
    return int(trigger_tokens * ROOM_SHARE) - committed_tokens
