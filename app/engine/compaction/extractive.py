"""The extractive summary: a structured summary built from the history, no model.

Used when no summarizer model is configured or when it fails: quotes, commands and
errors picked out of the entries and laid out in the sections of the structured prompt
(``app/prompts/structured.md``), so that the agent reads the same shape whichever way
its history was compacted. What each section holds, how ``instructions`` (the focus
asked for) and a hook's ``context`` lines are used, how a previous summary is carried
forward, and how the output is cut to ``max_chars`` (the pinned unresolved errors last)
are specified in docs/compaction-heuristics.md, "The extractive summary".
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from app.engine.compaction import anchors, patterns
from app.engine.compaction.continuity import ALSO_SEPARATOR
from app.engine.compaction.summary import (
    SPLIT_TURN_SEPARATOR,
    render_call,
    strip_file_tags,
    summary_from_context_message,
)
from app.engine.model import Entry, Part

DEFAULT_MAX_CHARS = 12_000

NOTE = (
    "_Extracted from the history without a model: quotes, commands and errors; lists newest first._"
)
NONE_RECORDED = "(none recorded)"
ORIGINAL_LABEL = "Original request:"
FAILED_MARK = " — failed"
PINNED_LABEL = "Unresolved:"
PINNED = 2  # how many unresolved errors Blocked keeps whatever its size
LATEST_LABEL = "Latest requests (newest first):"

# Per-item limits, in characters.
GOAL_CHARS = 1_500
GOAL_SHORT_CHARS = 200  # the first request, when the <user-requests> block quotes it
# Never the tag itself: a "<user-requests>" in the text would be read as the block's start.
QUOTED_NOTE = "(verbatim in the user-requests block below)"
LATEST_CHARS = 600
STATE_CHARS = 600
SENTENCE_CHARS = 300
COMMAND_CHARS = 200
ERROR_CHARS = 200
HINT_CHARS = 120
OUTPUT_TAIL_CHARS = 300
MIN_ITEM_CHARS = 40
ERROR_SCAN_CHARS = anchors.SCAN_CHARS  # how much of an output's end is searched for errors
PARSED_ITEM_CHARS = 600  # items read back from a summary; ours are all shorter

# The instructions' focus: how many terms, excerpts, and how wide an excerpt.
FOCUS_LABEL = "Focus asked for:"
FOCUS_TERMS = 12
FOCUS_ITEMS = 6
FOCUS_LINES_PER_TERM = 4
FOCUS_WINDOW = 160  # characters either side of a term in a long line
FOCUS_SHARE = 0.10  # of max_chars, on top of Critical Context's own share

# A hook's context lines: their section, and each line's limit.
CONTEXT_HEADING = "## Additional Context"
CONTEXT_CHARS = 1_000
CONTEXT_SHARE = 0.10  # of max_chars, on top of the others

# How many items each list keeps, at most.
CAPS = {
    "latest": 3,
    "constraints": 12,
    "done": 30,
    "in_progress": 3,
    "blocked": 8,
    "decisions": 10,
    "files": 60,
    "next": 5,
    "critical": 8,
    "hints": 15,
}

# The share of ``max_chars`` each section may keep when the whole is too long.
SHARES = {
    "goal": 0.24,
    "constraints": 0.10,
    "done": 0.14,
    "in_progress": 0.06,
    "blocked": 0.08,
    "decisions": 0.08,
    "files": 0.10,
    "next": 0.05,
    "critical": 0.09,
    "hints": 0.06,
}

HEADINGS = {
    "goal": "## Goal",
    "constraints": "## Constraints & Preferences",
    "done": "## Progress\n\n### Done",
    "in_progress": "### In Progress",
    "blocked": "### Blocked",
    "decisions": "## Key Decisions",
    "files": "## Files & Artifacts",
    "next": "## Next Steps",
    "critical": "## Critical Context",
    "hints": "## Lookup Hints",
}
LISTS = tuple(k for k in HEADINGS if k != "goal")


@dataclass(slots=True)
class SummaryFacts:
    """What a structured summary says, section by section; lists newest first."""

    original: str | None = None
    latest: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    in_progress: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    # The instructions and what the history says of their terms: the head of
    # Critical Context (a previous summary's are read back as critical items).
    focus: list[str] = field(default_factory=list)
    # The unresolved errors ("line — after `command`"), newest first: the latest of
    # this history, then the previous summary's if still unresolved (at most
    # :data:`PINNED` in all). The head of Blocked, trimmed last; a previous summary's are
    # read back as Blocked items too.
    pinned: list[str] = field(default_factory=list)
    # The context lines supplied for this summary (a later one reads them back as
    # Critical Context).
    context: list[str] = field(default_factory=list)

    def items(self, key: str) -> list[str]:
        """The list of section ``key`` (one of the keys of :data:`HEADINGS` but goal)."""
        value: list[str] = getattr(self, key)
        return value


# What a summary writes in an empty section; never an item.
_NONE = frozenset({"(none recorded)", "(none)", "none", "n/a", "-", "none."})


# --- Text helpers --------------------------------------------------------------------

_FENCED = re.compile(r"```.*?(?:```|\Z)", re.S)
# Where a sentence ends: after its punctuation, or at the end of its line.
_BOUNDARY = re.compile(r"(?<=[.!?])\s|\n")
SENTENCE_WINDOW = 600  # how far from a keyword a sentence's ends are looked for
# Markup a tool wraps its output in: ``<output>``, ``<returncode>0</returncode>``.
_TAG_LINE = re.compile(r"^\s*</?[A-Za-z_][\w-]*>(?:[^<>\n]{0,20}</[A-Za-z_][\w-]*>)?\s*$")


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line, whitespace collapsed, cut to ``limit`` with an ellipsis."""
    # Only a bounded head is collapsed: a megabyte of text need not be split.
    cut = len(text) > 4 * limit + 4
    line = " ".join((text[: 4 * limit + 4] if cut else text).split())
    if len(line) <= limit and not cut:
        return line
    return line[: max(limit - 1, 0)].rstrip() + "…"


_CLIPPED = re.compile(r"\n\[\.\.\. (\d+) chars clipped \.\.\.\]\Z")


def _head(text: str, limit: int) -> str:
    """The head of a multi-line ``text``, cut to ``limit`` with a note of what was cut.

    Cutting a text cut before counts both cuts in one note.
    """
    earlier = 0
    if m := _CLIPPED.search(text):
        text, earlier = text[: m.start()], int(m[1])
    if len(text) <= limit:
        return text if not earlier else f"{text}\n[... {earlier} chars clipped ...]"
    kept = text[:limit].rstrip()
    return f"{kept}\n[... {len(text) - len(kept) + earlier} chars clipped ...]"


def _normalize(text: str) -> str:
    """``text`` with plain newlines and no trailing spaces, so that it quotes back exactly."""
    return "\n".join(line.rstrip() for line in text.splitlines()).strip()


def _sentences(text: str, keywords: _Keywords) -> Iterator[str]:
    """The prose sentences of ``text`` that contain one of ``keywords``, one line each.

    Code blocks are left out. The text is searched for the keywords first and
    only the sentences around the matches are cut out, so a long text with
    few matches costs one regex scan.
    """
    prose = _FENCED.sub("\n", text) if "```" in text else text
    lowered = prose.lower()
    # A few characters lowercase to two; positions would shift, so search as is.
    matches = (
        keywords.lower.finditer(lowered)
        if len(lowered) == len(prose)
        else keywords.any_case.finditer(prose)
    )
    end = 0
    for m in matches:
        if m.start() < end:
            continue  # in the sentence just taken
        lo = max(m.start() - SENTENCE_WINDOW, end)
        start = lo
        for before in _BOUNDARY.finditer(prose, lo, m.start()):
            start = before.end()
        after = _BOUNDARY.search(prose, m.end(), m.end() + SENTENCE_WINDOW)
        end = after.start() if after is not None else min(len(prose), m.end() + SENTENCE_WINDOW)
        sentence = prose[start:end].strip()
        if len(sentence) >= 12 and not _TAG_LINE.match(sentence):
            yield _one_line(sentence.lstrip("-*•> "), SENTENCE_CHARS)


def _key(item: str) -> str:
    return " ".join(item.lower().split())


def _dedupe(items: Iterable[str], cap: int, key: Callable[[str], str] = _key) -> list[str]:
    """The first ``cap`` items, in order, the later of two equal ones dropped, and the
    items that say there is nothing (the whole item: an error line "(none)" followed by
    the command that printed it is an item)."""
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        k = key(item)
        if not k or k in seen or _key(item) in _NONE:
            continue
        seen.add(k)
        out.append(item)
        if len(out) >= cap:
            break
    return out


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.split("\n"))


# --- Reading the history -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Keywords:
    """A case-insensitive pattern, also compiled for lowercased text.

    Python's ``re`` scans a lowercased text with a case-sensitive pattern
    several times faster than the text with ``re.IGNORECASE``, which matters
    on a long history. The source must be lowercase.
    """

    lower: re.Pattern[str]
    any_case: re.Pattern[str]

    @classmethod
    def of(cls, source: str) -> _Keywords:
        if source != source.lower():
            raise ValueError("keyword patterns are written in lowercase")
        return cls(re.compile(source), re.compile(source, re.I))


# The catalogue of sentences worth quoting (:data:`app.engine.compaction.patterns.SENTENCES`).
_SENTENCES = {row.name: _Keywords.of(row.pattern.pattern) for row in patterns.SENTENCES}
_CONSTRAINT = _SENTENCES["constraint"]
_DECISION = _SENTENCES["decision"]
_FINDING = _SENTENCES["finding"]
_INTENT = _SENTENCES["intent"]
_CAMEL = re.compile(r"[a-z][A-Z]")
_BACKTICKED = re.compile(r"`([^`\n]{3,80})`")


@dataclass(slots=True)
class _Call:
    part: Part
    command: str | None


@dataclass(slots=True)
class _History:
    """The entries sorted by what the summary needs, in order."""

    user: list[str] = field(default_factory=list)
    assistant: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    results: list[Entry] = field(default_factory=list)
    result_of: dict[str, Entry] = field(default_factory=dict)
    call_of: dict[str, _Call] = field(default_factory=dict)
    context_summary: str | None = None
    outcomes: anchors.Outcomes = field(default_factory=dict)  # how each result went


def _command(part: Part) -> str | None:
    """The shell command of a tool call whose arguments carry one."""
    return anchors.command_of(part)


def _read(entries: Sequence[Entry]) -> _History:
    h = _History()
    for entry in entries:
        if entry.role == "user":
            text = _normalize(entry.text())
            if not text:
                continue
            inner = summary_from_context_message(text)
            if inner is not None:
                h.context_summary = inner
            else:
                h.user.append(text)
        elif entry.role == "assistant":
            text = _normalize(entry.text())
            if text:
                h.assistant.append(text)
            for part in entry.tool_calls():
                call = _Call(part, _command(part))
                h.calls.append(call)
                h.call_of[part["id"]] = call
        elif entry.role == "tool":
            h.results.append(entry)
            if entry.tool_call_id:
                h.result_of[entry.tool_call_id] = entry
    return h


def _outcome(h: _History, entry: Entry, call: _Call | None) -> anchors.Outcome:
    result = h.outcomes.get(id(entry))
    if result is None:
        command = call.command if call is not None else None
        result = anchors.outcome(entry.text(), is_error=entry.is_error, command=command)
        h.outcomes[id(entry)] = result
    return result


def _error_items(result: anchors.Outcome) -> list[tuple[str, anchors.ErrorLine]]:
    """The lines that say what went wrong in a failed result, the most telling first:
    two at most (an exception and the traceback's last frame, a failed test and its
    message), each as Blocked shows it: the first with the lines it is quoted with (the
    output's last error line, a syntax error's location), as a pinned error is."""
    lines = list(result.lines[:2])
    if not lines:
        return []
    first = lines[0]
    also = [x for x in dict.fromkeys((result.last, result.where)) if x and x != first.text]
    shown = ALSO_SEPARATOR.join(_one_line(x, ERROR_CHARS) for x in (first.text, *also))
    out = [(shown, first)]
    out += [(_one_line(e.text, ERROR_CHARS), e) for e in lines[1:] if e.text not in also]
    return out


def _findable(span: str) -> bool:
    """Whether a code span names something specific enough to search for."""
    span = span.strip()
    if len(span) < 4 or sum(c.isalpha() for c in span) < 3:
        return False
    return len(span) >= 10 or any(c in span for c in "_./(:=-") or _CAMEL.search(span) is not None


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _call_line(call: _Call, limit: int) -> str:
    if call.command is not None:
        lines = call.command.strip().splitlines()
        shown = _one_line(lines[0], limit)
        if len(lines) > 1:
            shown += f" …(+{len(lines) - 1} lines)"
        return _code(shown)
    return _code(_one_line(render_call(call.part, limit), limit))


def _done_key(item: str) -> str:
    return _key(item.removesuffix(FAILED_MARK))


def _blocked_key(item: str) -> str:
    return _key(item.split(" — after ", 1)[0])


def _file_key(item: str) -> str:
    m = re.match(r"`+\s*(.*?)\s*`+", item)
    return m[1] if m else _key(item)


def _pinned_line(text: str) -> str:
    # A line separator of another kind (U+2028, a form feed...) would end the line when
    # the summary is read back: a space, so that the item reads back as written.
    line = " ".join(text.strip().splitlines())
    if len(line) > ERROR_CHARS:
        line = line[: ERROR_CHARS - 1].rstrip() + "…"
    return line


def _pinned_item(anchor: anchors.ErrorAnchor) -> str | None:
    """The latest unresolved error as Blocked shows it: its line exactly (clipped only
    beyond :data:`ERROR_CHARS`, its start kept: it names the exception), then what else
    it is quoted with (the output's last error line, a syntax error's location), and the
    command that produced it (the part that ran the failing check)."""
    line = anchor.line.strip()
    if not line or "\n" in line:
        return None
    line = ALSO_SEPARATOR.join(_pinned_line(x) for x in (line, *anchor.also) if x.strip())
    label = _one_line(anchor.label, anchors.LABEL_CHARS)
    return f"{line} — after {_code(label)}" if label else line


_AFTER = re.compile(r" — after (`+) ?(.+?) ?\1$")


def _pinned_command(item: str) -> str | None:
    """The command a pinned item names, to tell whether a later history resolved it
    (a clipped one without its last, cut word)."""
    m = _AFTER.search(item)
    if m is None:
        return None
    command: str = m[2]
    return command.rsplit(" ", 1)[0] if command.endswith("…") else command


def _same_error(a: str, b: str) -> bool:
    ka, kb = _blocked_key(a).rstrip("…"), _blocked_key(b).rstrip("…")
    return ka.startswith(kb) or kb.startswith(ka)


def _done_line(h: _History, call: _Call) -> str:
    line = _call_line(call, COMMAND_CHARS)
    result = h.result_of.get(call.part["id"])
    if result is not None and _outcome(h, result, call).failed:
        line += FAILED_MARK
    return line


def _extract(h: _History, read_files: Sequence[str], modified_files: Sequence[str]) -> SummaryFacts:
    facts = SummaryFacts()
    if h.user:
        facts.original = _head(h.user[0], GOAL_CHARS)
        first = _key(h.user[0])
        later = (t for t in reversed(h.user[1:]) if _key(t) != first)
        facts.latest = _dedupe((_head(t, LATEST_CHARS) for t in later), CAPS["latest"])
    facts.constraints = _dedupe(
        (s for text in reversed(h.user) for s in _sentences(text, _CONSTRAINT)),
        CAPS["constraints"],
    )

    done: list[str] = []
    for call in reversed(h.calls):
        done.append(_done_line(h, call))
        if len(done) >= CAPS["done"] * 2:  # room for duplicates
            break
    facts.done = _dedupe(done, CAPS["done"], _done_key)

    if h.assistant:
        facts.in_progress = _dedupe([_one_line(h.assistant[-1], STATE_CHARS)], 1)

    blocked: list[str] = []
    hints: list[str] = []
    for result in reversed(h.results):
        origin = h.call_of.get(result.tool_call_id or "")
        outcome = _outcome(h, result, origin)
        if not outcome.failed:
            continue
        after = f" — after {_call_line(origin, 80)}" if origin is not None else ""
        for shown, error in _error_items(outcome):
            blocked.append(shown + after)
            line = _one_line(error.text, ERROR_CHARS)
            if error.rank <= anchors.SUMMARY and "`" not in line:
                # A prefix of the line, not an ellipsis: the hint must stay findable.
                hints.append(_code(line.removesuffix("…")[:HINT_CHARS].rstrip()))
        if len(blocked) >= CAPS["blocked"] * 2:
            break
    facts.blocked = _dedupe(blocked, CAPS["blocked"], _blocked_key)

    decisions: list[str] = []
    findings: list[str] = []
    for text in reversed(h.assistant):
        if len(decisions) >= CAPS["decisions"] and len(findings) >= CAPS["critical"]:
            break
        decisions += _sentences(text, _DECISION)
        findings += _sentences(text, _FINDING)
    facts.decisions = _dedupe(decisions, CAPS["decisions"])

    modified = list(dict.fromkeys(p for p in modified_files if p))
    changed = set(modified)
    read = [p for p in dict.fromkeys(read_files) if p and p not in changed]
    facts.files = _dedupe(
        [f"{_code(p)} (modified)" for p in modified] + [f"{_code(p)} (read)" for p in read],
        CAPS["files"],
        _file_key,
    )

    # What the agent last said it would do; older intentions were acted on since.
    for text in reversed(h.assistant[-3:]):
        facts.next = _dedupe(_sentences(text, _INTENT), CAPS["next"])
        if facts.next:
            break

    critical: list[str] = []
    if h.results:
        last = h.results[-1]
        lines = [ln for ln in _normalize(last.text()).splitlines() if not _TAG_LINE.match(ln)]
        output = " ".join(" ".join(lines).split())
        if output:
            origin = h.call_of.get(last.tool_call_id or "")
            source = f" (after {_call_line(origin, 80)})" if origin is not None else ""
            tail = output if len(output) <= OUTPUT_TAIL_CHARS else "…" + output[-OUTPUT_TAIL_CHARS:]
            critical.append(f"Latest tool output{source}: {tail}")
    facts.critical = _dedupe(critical + findings, CAPS["critical"])

    for text in reversed(h.assistant):
        if len(hints) >= CAPS["hints"] * 2:
            break
        hints += (_code(m[1].strip()) for m in _BACKTICKED.finditer(text) if _findable(m[1]))
    facts.hints = _dedupe(hints, CAPS["hints"])
    return facts


# --- The instructions' focus ---------------------------------------------------------

# Words an instruction is made of rather than what it is about.
_COMMON_WORDS = """
    a about above after again all also always am an and any anything are as at be because
    been before being below between both but by can cannot could detail details did didn do
    does doesn doing don done during each else especially even every everything few focus
    for from further get got had has have having he her here hers him his how however i if
    important in include including info information into is isn it its itself just keep
    kept know let like make many me mention mentions might more most much must my need
    needs no nor not note notes now of off on once one only or other our out over own
    particular particularly please point points preserve rather really remember retain said
    same say see she should shouldn so some something such summarise summarize summary sure
    than that the their them then there these they thing things this those through to too
    track under until up upon us very want was wasn way we were what when where whether
    which while who whom why will with won work would wouldn yes yet you your yours
"""
_COMMON = frozenset(_COMMON_WORDS.split())
_SPAN = re.compile(r"`([^`\n]{2,80})`|\"([^\"\n]{3,80})\"|\u201c([^\u201d\n]{3,80})\u201d")
_WORD = re.compile(r"\w[\w./:-]*\w|\w")


def focus_terms(instructions: str | None) -> list[str]:
    """The distinctive terms of ``instructions``, lowercase, most specific first:
    every backticked or double-quoted span, then the words of three characters
    or more that are not common English, longest first; at most
    :data:`FOCUS_TERMS`."""
    if not instructions:
        return []
    spans = [next(g for g in m.groups() if g).strip().lower() for m in _SPAN.finditer(instructions)]
    words = [
        w
        for w in (m[0].lower() for m in _WORD.finditer(instructions))
        if len(w) >= 3 and w not in _COMMON and not w.isdigit()
    ]
    ordered = [t for t in spans if t] + sorted(dict.fromkeys(words), key=len, reverse=True)
    return list(dict.fromkeys(ordered))[:FOCUS_TERMS]


@dataclass(frozen=True, slots=True)
class _Focus:
    instructions: str
    terms: tuple[str, ...]
    pattern: re.Pattern[str] | None

    @classmethod
    def of(cls, instructions: str) -> _Focus:
        terms = tuple(focus_terms(instructions))
        pattern = re.compile("|".join(map(re.escape, terms)), re.I) if terms else None
        return cls(instructions, terms, pattern)

    def names(self, item: str) -> bool:
        return self.pattern is not None and self.pattern.search(item) is not None


def _texts_newest_first(entries: Sequence[Entry], h: _History) -> Iterator[tuple[str, str]]:
    """(where it comes from, text) of every entry, newest first; a compaction
    summary message is left out (the previous summary is carried forward as such)."""
    for entry in reversed(entries):
        if entry.role == "tool":
            origin = h.call_of.get(entry.tool_call_id or "")
            label = f"output of {_call_line(origin, 60)}" if origin is not None else "tool output"
            yield label, entry.text()
        elif entry.role == "assistant":
            for part in reversed(entry.tool_calls()):
                yield "call", _call_line(_Call(part, _command(part)), COMMAND_CHARS)
            yield "assistant", entry.text()
        elif entry.role == "user":
            text = entry.text()
            if summary_from_context_message(text) is None:
                yield "user", text


def _excerpt(text: str, start: int, end: int) -> str:
    """The line around ``text[start:end]``, clipped to :data:`FOCUS_WINDOW` either side."""
    lo = text.rfind("\n", 0, start) + 1
    hi = text.find("\n", end)
    hi = len(text) if hi < 0 else hi
    left, right = max(lo, start - FOCUS_WINDOW), min(hi, end + FOCUS_WINDOW)
    line = text[left:right]
    return ("…" if left > lo else "") + line + ("…" if right < hi else "")


def _focus_items(entries: Sequence[Entry], h: _History, focus: _Focus) -> list[str]:
    """The lines of the history that name the focus terms, the most specific first.

    Every text is looked through (a substring test per term, newest first), so a
    term said once, long ago, is found. A line's weight is the sum, over the
    terms it names, of one over the number of texts naming that term: a rare
    term outweighs a common one. Ties go to the newer line.
    """
    if not focus.terms:
        return []
    seen_in = dict.fromkeys(focus.terms, 0)
    found: list[tuple[int, str]] = []  # (recency, item)
    wanted = dict.fromkeys(focus.terms, FOCUS_LINES_PER_TERM)
    singles = {t: re.compile(re.escape(t), re.I) for t in focus.terms}
    for recency, (label, text) in enumerate(_texts_newest_first(entries, h)):
        if not text:
            continue
        lowered = text.lower()
        for term in focus.terms:
            if term not in lowered:
                continue
            seen_in[term] += 1
            if wanted[term] <= 0:
                continue
            m = singles[term].search(text)
            if m is None:  # lowercasing moved it: a rare Unicode case
                continue
            wanted[term] -= 1
            excerpt = _one_line(_excerpt(text, m.start(), m.end()), SENTENCE_CHARS)
            found.append((recency, excerpt if label == "call" else f"{label}: {excerpt}"))

    def weight(item: str) -> float:
        lowered = item.lower()
        return sum(1 / seen_in[t] for t in focus.terms if seen_in[t] and t in lowered)

    ranked = sorted(found, key=lambda f: (-weight(f[1]), f[0]))
    return _dedupe((item for _, item in ranked), FOCUS_ITEMS)


def _apply_focus(
    facts: SummaryFacts, entries: Sequence[Entry], h: _History, instructions: str
) -> None:
    """Put the instructions' focus into ``facts``: their excerpts at the head of
    Critical Context, and in every list the items that name a term first."""
    focus = _Focus.of(instructions)
    if focus.pattern is not None:
        # The commands that name a term, however old (the list holds the newest only).
        named = (c for c in reversed(h.calls) if focus.names(_call_line(c, COMMAND_CHARS)))
        older = [_done_line(h, c) for c in itertools.islice(named, CAPS["done"])]
        facts.done = _dedupe([*older, *facts.done], CAPS["done"], _done_key)
    for key in LISTS:
        facts.items(key).sort(key=lambda item: not focus.names(item))  # stable
    facts.focus = [
        f"{FOCUS_LABEL} {_one_line(instructions, STATE_CHARS)}",
        *_focus_items(entries, h, focus),
    ]


# --- Reading a previous summary ------------------------------------------------------

_HEADING = re.compile(r"^(#{2,3})\s+(.+?)\s*#*\s*$")
_LIST_MARKER = re.compile(r"^(?:[-*+•]|\d+[.)])\s+")


def _section_key(title: str) -> str:
    t = title.lower()
    if "lookup" in t or "hint" in t:
        return "hints"
    if "goal" in t or "task" in t or "request" in t:
        return "goal"
    if "constraint" in t or "preference" in t or "requirement" in t:
        return "constraints"
    if "progress" in t:
        return "done"
    if "decision" in t:
        return "decisions"
    if "file" in t or "artifact" in t:
        return "files"
    if "next" in t or "pending" in t:
        return "next"
    return "critical"


def _subsection_key(title: str) -> str | None:
    t = title.lower()
    if "in progress" in t or "current" in t:
        return "in_progress"
    if "done" in t or "complete" in t:
        return "done"
    if "block" in t or "issue" in t or "open" in t:
        return "blocked"
    return None


def _items(lines: Sequence[str], limit: int) -> list[str]:
    items: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("```") or stripped.lower() in _NONE:
            continue
        m = _LIST_MARKER.match(stripped)
        if m is not None:
            items.append(stripped[m.end() :])
        elif items and line[:1] in (" ", "\t"):
            items[-1] += " " + stripped
        else:
            items.append(stripped)
    # Clipped but not collapsed: a code span keeps its exact spacing, to be searched for.
    return [
        i if len(i) <= limit else i[: limit - 1].rstrip() + "…"
        for i in items
        if i.strip().lower() not in _NONE
    ]


def _quotes(lines: Sequence[str]) -> list[str]:
    """The blockquotes among ``lines``, each unquoted."""
    blocks: list[list[str]] = []
    inside = False
    for line in lines:
        if line.startswith(">"):
            text = line[2:] if line.startswith("> ") else line[1:]
            if inside:
                blocks[-1].append(text)
            else:
                blocks.append([text])
            inside = True
        else:
            inside = False
    return ["\n".join(b).strip() for b in blocks if "\n".join(b).strip()]


def _goal(lines: Sequence[str]) -> tuple[str | None, list[str]]:
    stripped = [ln.rstrip() for ln in lines]
    if ORIGINAL_LABEL in stripped or LATEST_LABEL in stripped:
        cut = stripped.index(LATEST_LABEL) if LATEST_LABEL in stripped else len(stripped)
        originals = _quotes(stripped[:cut])
        return (originals[0] if originals else None), _quotes(stripped[cut:])
    text = "\n".join(stripped).strip()
    if not text or text.lower() in _NONE:
        return None, []
    return _head(text, GOAL_CHARS), []


def parse_summary(text: str) -> SummaryFacts:
    """The sections of a summary, best effort.

    Exact for the summaries written here; a model's structured summary maps
    its ``##`` and ``###`` headings onto the same sections by their titles
    (unknown ones go to Critical Context); a summary without headings is taken
    as its goal. File tags and the split-turn appendix are left out.
    """
    body = strip_file_tags(text)
    body, _, turn = body.partition(SPLIT_TURN_SEPARATOR.strip())
    body = body.rstrip().removesuffix("---").rstrip()
    sections: dict[str, list[str]] = {}
    current: str | None = None
    parent: str | None = None
    for line in _normalize(body).splitlines():
        m = _HEADING.match(line)
        if m is not None:
            if len(m[1]) == 2:
                parent = current = _section_key(m[2])
            else:
                current = _subsection_key(m[2]) or parent or "critical"
            sections.setdefault(current, [])
            continue
        if current is not None:
            sections[current].append(line)
    facts = SummaryFacts()
    if not sections:
        facts.original, facts.latest = _goal(_normalize(body).splitlines())
    else:
        facts.original, facts.latest = _goal(sections.get("goal", []))
        for key in LISTS:
            facts.items(key).extend(_items(sections.get(key, []), PARSED_ITEM_CHARS))
    if turn.strip():
        facts.critical.insert(0, "Split turn: " + _one_line(turn, STATE_CHARS))
    for k, item in enumerate(facts.blocked):
        if item.startswith(PINNED_LABEL) and len(facts.pinned) < PINNED:
            facts.blocked[k] = item.removeprefix(PINNED_LABEL).strip()
            facts.pinned.append(facts.blocked[k])
    return facts


def _merge(new: SummaryFacts, old: SummaryFacts) -> SummaryFacts:
    """``new`` carried onto ``old``: the old original goal, the rest newest first."""
    merged = SummaryFacts()
    if old.original:
        merged.original = old.original
        # The first request of the new range is its oldest: it follows the others.
        first = [_head(new.original, LATEST_CHARS)] if new.original else []
        later = [*new.latest, *first, *old.latest]
    else:
        merged.original = new.original
        later = [*new.latest, *old.latest]
    original = _key(merged.original or "")
    merged.latest = _dedupe((t for t in later if _key(t) != original), CAPS["latest"])
    merged.focus = new.focus
    merged.pinned = _dedupe([*new.pinned, *old.pinned], PINNED, _blocked_key)
    focused = {_key(i) for i in new.focus}
    for key in LISTS:
        if key in ("in_progress", "next"):
            items = new.items(key) or old.items(key)
        else:
            items = new.items(key) + old.items(key)
        if key == "critical":  # a previous summary's focus, asked again
            items = [i for i in items if _key(i) not in focused]
        dedupe_key = {"done": _done_key, "blocked": _blocked_key, "files": _file_key}.get(key, _key)
        merged.items(key).extend(_dedupe(items, CAPS[key], dedupe_key))
    return merged


# --- Writing it out ------------------------------------------------------------------


def _short_goal(original: str, quoted: bool) -> str:
    """The first request as Goal gives it: whole (as parsed or clipped) when no block
    quotes it, else its head on one line and :data:`QUOTED_NOTE`. Idempotent: a
    previous summary's short goal is read back and written again unchanged."""
    text = original.removesuffix(QUOTED_NOTE).rstrip()
    if not quoted:
        return text if text else original
    if m := _CLIPPED.search(text):
        text = text[: m.start()]
    return f"{_one_line(text, GOAL_SHORT_CHARS)} {QUOTED_NOTE}"


def _render_goal(facts: SummaryFacts) -> str:
    parts = [HEADINGS["goal"]]
    if facts.original:
        parts.append(f"{ORIGINAL_LABEL}\n{_quote(facts.original)}")
    if facts.latest:
        parts.append(LATEST_LABEL + "\n" + "\n\n".join(_quote(t) for t in facts.latest))
    if len(parts) == 1:
        parts.append(NONE_RECORDED)
    return "\n".join(parts[:2]) + "".join(f"\n\n{p}" for p in parts[2:])


def _render_list(facts: SummaryFacts, key: str) -> str:
    items = facts.items(key)
    if key == "critical":
        items = facts.focus + items
    elif key == "blocked" and facts.pinned:
        pinned = facts.pinned
        items = [
            *(f"{PINNED_LABEL} {p}" for p in pinned),
            *(i for i in items if not any(_same_error(i, p) for p in pinned)),
        ]
    body = "\n".join(f"- {i}" for i in items) if items else NONE_RECORDED
    return f"{HEADINGS[key]}\n{body}"


def _render_section(facts: SummaryFacts, key: str) -> str:
    if key == "context":
        return CONTEXT_HEADING + "\n" + "\n".join(f"- {line}" for line in facts.context)
    return _render_goal(facts) if key == "goal" else _render_list(facts, key)


def _trim(facts: SummaryFacts, key: str) -> bool:
    """Make section ``key`` shorter by one step; False when it cannot be."""
    if key == "goal":
        if facts.latest:
            facts.latest.pop()
            return True
        if facts.original:
            shorter = _head(facts.original, len(facts.original) // 2)
            too_short = len(shorter) >= len(facts.original) or len(shorter) < MIN_ITEM_CHARS
            facts.original = None if too_short else shorter
            return True
        return False
    if key == "context":
        return _trim_list(facts.context)
    # The focus goes last: it is what the user asked this summary to keep.
    lists = [facts.items(key), facts.focus] if key == "critical" else [facts.items(key)]
    return any(_trim_list(items) for items in lists)


def _trim_list(items: list[str]) -> bool:
    if len(items) > 1:
        items.pop()
        return True
    if items and len(items[0]) > MIN_ITEM_CHARS:
        items[0] = _one_line(items[0], len(items[0]) // 2)
        return True
    if items:
        items.pop()
        return True
    return False


def _clip_pinned(facts: SummaryFacts) -> bool:
    """The last resort, when no other section can give more: the longest pinned error's
    line is clipped (its start and its command kept, so that it still names the error
    and a later history can still resolve it), or, too short to clip or clipped into
    another's, the oldest is dropped. False when none is left.

    Cutting the rendered text instead left a summary that did not read back as itself
    (an item cut after its list marker or a space lost it when carried forward)."""
    if not facts.pinned:
        return False
    k = max(range(len(facts.pinned)), key=lambda i: len(facts.pinned[i]))
    item = facts.pinned[k]
    m = _AFTER.search(item)
    line, after = (item[: m.start()], item[m.start() :]) if m else (item, "")
    if len(line) <= MIN_ITEM_CHARS:
        facts.pinned.pop()
        return True
    clipped = line[: max(len(line) // 2, MIN_ITEM_CHARS) - 1].rstrip() + "…" + after
    others = {_blocked_key(p) for i, p in enumerate(facts.pinned) if i != k}
    if _blocked_key(clipped) in others:
        facts.pinned.pop(k)
    else:
        facts.pinned[k] = clipped
    return True


def _render(facts: SummaryFacts, max_chars: int) -> str:
    keys = list(HEADINGS)
    shares = dict(SHARES)
    if facts.context:
        # After Critical Context, before Lookup Hints.
        keys.insert(keys.index("critical") + 1, "context")
        shares["context"] = CONTEXT_SHARE
    sizes = {k: len(_render_section(facts, k)) for k in keys}
    separators = 2 * len(keys)  # a blank line after the note and between sections
    if facts.focus:
        shares["critical"] += FOCUS_SHARE
    stuck: set[str] = set()
    while len(NOTE) + separators + sum(sizes.values()) > max_chars and len(stuck) < len(keys):
        key = max(
            (k for k in keys if k not in stuck), key=lambda k: sizes[k] - shares[k] * max_chars
        )
        before = sizes[key]
        if _trim(facts, key):
            sizes[key] = len(_render_section(facts, key))
        if sizes[key] >= before:  # nothing left to take from this section
            stuck.add(key)
    while len(NOTE) + separators + sum(sizes.values()) > max_chars and _clip_pinned(facts):
        sizes["blocked"] = len(_render_section(facts, "blocked"))
    text = "\n\n".join([NOTE, *(_render_section(facts, k) for k in keys)])
    # Cut only below the room the headings need (they alone are longer).
    return text[:max_chars]


def extractive_summary(
    entries: Sequence[Entry],
    *,
    previous_summary: str | None = None,
    read_files: Sequence[str] = (),
    modified_files: Sequence[str] = (),
    max_chars: int = DEFAULT_MAX_CHARS,
    instructions: str | None = None,
    first_request_quoted: bool = False,
    context: Sequence[str] = (),
) -> str:
    """A structured summary of ``entries`` without a model, at most ``max_chars`` long.

    ``previous_summary`` (the summary of the history before ``entries``) is
    carried forward; when it is None and the entries open with a compaction
    summary message (:func:`app.engine.compaction.summary.render_context_message`), that
    one is. ``read_files`` and ``modified_files`` are the cumulative file lists.
    ``instructions`` are the focus asked for (docs/compaction-heuristics.md).
    ``first_request_quoted``: the summary's ``<user-requests>`` block quotes the
    first request, so Goal only names it in short. ``context`` lines are quoted
    in their own section (docs/compaction-heuristics.md).
    The result has no file tags; add them with
    :func:`app.engine.compaction.summary.with_file_tags` like any other summary.
    """
    history = _read(entries)
    facts = _extract(history, read_files, modified_files)
    unresolved = anchors.unresolved_errors(entries, PINNED, history.outcomes)
    # Deduplicated as a summary read back dedupes them (the same error of the same
    # command, run twice, is one item).
    facts.pinned = _dedupe(
        (p for a in unresolved if (p := _pinned_item(a)) is not None), PINNED, _blocked_key
    )
    if instructions is not None and instructions.strip():
        _apply_focus(facts, entries, history, instructions.strip())
    previous = previous_summary if previous_summary is not None else history.context_summary
    if previous is not None and previous.strip():
        old = parse_summary(previous)
        # The previous summary's unresolved errors stay pinned until resolved, or until
        # the same check fails again here (its newer error is the one pinned now).
        old.pinned = [
            item
            for item in old.pinned
            if (command := _pinned_command(item)) is None
            or not anchors.is_superseded(command, entries, history.outcomes)
        ]
        facts = _merge(facts, old)
    if facts.original:
        facts.original = _short_goal(facts.original, first_request_quoted)
    facts.context = [_one_line(line, CONTEXT_CHARS) for line in context if line.strip()]
    return _render(facts, max(max_chars, 0))
