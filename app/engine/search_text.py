"""The plain text of an entry that recall searches (``entry.search_text``).

Computed once, when the entry is written, from its parts: the text parts, readable
reasoning, each tool call's name and arguments (their JSON decoded, so that a
command or a path reads as the agent wrote it, not with ``\\n`` and ``\\"``
escapes), a tool result's output (its text parts), and the words of opaque blocks
(a document's text, a search result's title and URL...). Images, signatures and
encrypted content are left out: they are not words anyone searches for.

A tool result's text starts with a line naming its call (:func:`call_line`: the
tool's name and the call's arguments decoded, ``$ <command>`` for a shell call, at
most :data:`CALL_CHARS` characters), so that the words an agent remembers from the
call (the command, the path) find the output together with the words of the output.

Bounded: the first :data:`HEAD_CHARS` and the last :data:`TAIL_CHARS` characters
(a long output's start says what ran, its end how it ended: the error). An append
writes the text of its first entries, up to :data:`APPEND_CHARS` in all
(:func:`for_append`); the worker's indexer writes the rest's soon after. Postgres
stores neither NUL nor a lone surrogate, so neither is ever in the result, whatever
the parts hold. The database derives the full-text vector from this text
(migration 0010), and the trigram index is on the text itself.

Pure: no database.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.engine.model import Entry

HEAD_CHARS = 16_000
TAIL_CHARS = 4_000
# Between the head and the tail of a text cut in the middle.
ELISION = "\n…\n"
MAX_CHARS = HEAD_CHARS + len(ELISION) + TAIL_CHARS
# The searchable characters one append writes itself. Postgres indexes them in the
# append's statement, at about 1 to 2 us a character for the words and the trigrams
# (random text is the worst): a bulk append of 8 MB took longer than the statement
# timeout. Past this an append leaves its entries' text to the indexer.
APPEND_CHARS = 500_000

# In an opaque block: the keys whose string values are words, and those never read.
_WORD_KEYS = frozenset(
    {
        "text",
        "title",
        "url",
        "query",
        "name",
        "refusal",
        "content",
        "input",
        "command",
        "code",
        "stdout",
        "stderr",
        "transcript",
        "error_code",
    }
)
_SKIPPED_KEYS = frozenset(
    {"data", "signature", "encrypted_content", "encrypted_index", "file_data", "cache_control"}
)
# How deep an opaque block or a call's arguments are walked (values deeper are left out).
_MAX_DEPTH = 16


def search_text(parts: Sequence[Mapping[str, Any]], call: str = "") -> str:
    """The searchable text of an entry with these parts: bounded, NUL-free, valid
    UTF-8 (a lone surrogate becomes U+FFFD). ``call``: a tool result's call, as
    :func:`call_line` writes it, put first (see :func:`with_call`)."""
    return with_call(clean(bound("\n".join(piece for piece in _pieces(parts) if piece))), call)


def with_call(text: str, call: str) -> str:
    """A tool result's searchable ``text`` after the line naming its ``call``."""
    return f"{call}\n{text}" if call else text


def for_append(
    entries: Sequence[Sequence[Mapping[str, Any]]], budget: int = APPEND_CHARS
) -> tuple[list[str], list[bool]]:
    """The searchable text an append writes for each of its entries (their parts),
    and which it leaves to the indexer (an empty text, pending): the first entry
    always, then the next ones while their texts come to at most ``budget``
    characters; from the first that does not fit on, every entry is pending."""
    texts: list[str] = []
    pending: list[bool] = []
    used = 0
    for parts in entries:
        if pending and pending[-1]:
            texts.append("")
            pending.append(True)
            continue
        text = search_text(parts)
        if pending and used + len(text) > budget:
            texts.append("")
            pending.append(True)
            continue
        used += len(text)
        texts.append(text)
        pending.append(False)
    return texts, pending


# --- a tool result's call ----------------------------------------------------------------

# The line naming a result's call holds at most this many characters (and a "…").
CALL_CHARS = 300
# What of a call's arguments is read for it: the head of their JSON (a file's
# whole content is not needed to name the call; see :func:`call_line`).
CALL_ARGUMENTS_CHARS = 2_000
# Arguments that are the command a shell tool ran.
_COMMAND_KEYS = ("command", "cmd", "script")
# In JSON cut short: a key and its value (a string, complete or cut at the end, or a
# number or a literal).
_PAIR = re.compile(
    r'"((?:[^"\\]|\\.){1,64})"\s*:\s*(?:"((?:[^"\\]|\\.)*)("?)|(-?\d[\d.eE+-]*|true|false))'
)


def call_line(name: str | None, arguments: str | None) -> str:
    """The line that names a tool result's call in its searchable text: the tool's
    name, then ``$ <command>`` for a shell call (an argument ``command``, ``cmd`` or
    ``script``), else the arguments' values in order (a number as ``key: value``);
    their JSON decoded, read from its first :data:`CALL_ARGUMENTS_CHARS` characters
    (a cut string's head is kept); at most :data:`CALL_CHARS` characters, cut with
    ``…``. The command's own line breaks are kept. Empty without a name or arguments."""
    values = _call_values(arguments[:CALL_ARGUMENTS_CHARS] if arguments else "")
    line = " ".join(v for v in (name or "", values) if v)
    if len(line) > CALL_CHARS:
        line = line[:CALL_CHARS] + "…"
    return clean(line)


def _call_values(raw: str) -> str:
    if not raw.strip():
        return ""
    try:
        decoded: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        decoded = _loose(raw) if raw.lstrip().startswith("{") else raw
    if not isinstance(decoded, Mapping):
        return "\n".join(_values(decoded, 0))
    for key in _COMMAND_KEYS:
        command = decoded.get(key)
        if isinstance(command, list):
            command = " ".join(str(c) for c in command if isinstance(c, str | int | float))
        if isinstance(command, str) and command.strip():
            return f"$ {command}"
    out: list[str] = []
    for key, value in decoded.items():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append(f"{key}: {value}")
    return " ".join(v for v in out if v)


def _loose(raw: str) -> dict[str, Any]:
    """The keys and values of a JSON object cut short (its head), as far as they go."""
    found: dict[str, Any] = {}
    for m in _PAIR.finditer(raw):
        key = _unescape(m[1])
        if m[2] is not None:
            found.setdefault(key, _unescape(m[2]))
        elif m[4] not in ("true", "false"):
            try:
                found.setdefault(key, orjson.loads(m[4]))
            except orjson.JSONDecodeError:
                continue
    return found


def _unescape(value: str) -> str:
    try:
        decoded = orjson.loads(f'"{value}"')
    except orjson.JSONDecodeError:  # cut inside an escape
        cut = value.rfind("\\")
        try:
            decoded = orjson.loads(f'"{value[:cut]}"') if cut >= 0 else value
        except orjson.JSONDecodeError:
            return value
    return decoded if isinstance(decoded, str) else value


def with_calls(
    texts: Sequence[str],
    pending: Sequence[bool],
    entries: Sequence[Entry],
    stored: Mapping[str, tuple[str, str | None]],
) -> list[str]:
    """An append's ``texts`` (:func:`for_append`), each tool result's after the line
    naming its call (:func:`call_line`): the latest call with its id before it in the
    batch, else the open call ``stored`` names (its name and arguments, read with the
    append's stored calls). A text left to the indexer (``pending``) stays empty: the
    indexer finds the call itself."""
    out = list(texts)
    made: dict[str, tuple[str, str | None]] = {}
    for k, entry in enumerate(entries):
        for call in entry.tool_calls():
            made[call["id"]] = (call.get("name") or "", call.get("arguments"))
        if entry.role != "tool" or entry.tool_call_id is None or pending[k]:
            continue
        found = made.pop(entry.tool_call_id, None) or stored.get(entry.tool_call_id)
        if found is not None:
            out[k] = with_call(out[k], call_line(*found))
    return out


def bound(text: str) -> str:
    """``text`` within :data:`MAX_CHARS`: its head and its tail when longer."""
    if len(text) <= MAX_CHARS:
        return text
    return text[:HEAD_CHARS] + ELISION + text[-TAIL_CHARS:]


def clean(text: str) -> str:
    """``text`` as Postgres stores it: no NUL, no lone surrogate."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def _pieces(parts: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    for part in parts:
        kind = part.get("type")
        if kind == "text":
            yield _string(part.get("text"))
        elif kind == "reasoning":
            yield _string(part.get("text"))  # a redacted block has none
        elif kind == "tool_call":
            yield _string(part.get("name"))
            yield _arguments(part.get("arguments"))
        elif kind == "opaque":
            yield from _words(part.get("block"), 0)


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _arguments(raw: Any) -> str:
    """A call's arguments as text: the JSON's keys and values, one per line; the raw
    text when it is not JSON (a model can produce anything)."""
    if not isinstance(raw, str) or not raw:
        return ""
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    return "\n".join(_values(decoded, 0))


def _values(value: Any, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, str | int | float) and not isinstance(item, bool):
                yield f"{key}: {item}"
            else:
                yield str(key)
                yield from _values(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _values(item, depth + 1)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def _words(value: Any, depth: int) -> Iterator[str]:
    """The words of an opaque block: strings under :data:`_WORD_KEYS`, anywhere in it."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in _SKIPPED_KEYS:
                continue
            if isinstance(item, str):
                if key in _WORD_KEYS:
                    yield item
            elif isinstance(item, Mapping | list):
                yield from _words(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _words(item, depth + 1)


# --- reading a query -------------------------------------------------------------

# The regex of a word character next to the query: where it is, the query is inside a
# longer word (a Postgres ARE class, as the database's ``~*`` reads it).
_WORD_CLASS = "[:alnum:]_"
MARK_START = "«"
MARK_END = "»"
_PUNCTUATION = frozenset(string.punctuation)
_TRIGRAM = re.compile(r"[^\W_]{3}")


# A query that is a place in a file: ``registry.py:135``, ``registry.py line 135``,
# ``File "…/registry.py", line 135``, ``registry.py(135)``, ``registry.py#L135``,
# ``registry.py:135:7``. The path has an extension (a dot and 1 to 10 word characters).
_LOCATION = re.compile(
    r"""(?:file\s+)?["']?(?P<path>[^\s"'(),:#]*[^\s"'(),:#./]\.[\w+-]{1,10})["']?"""
    r"(?:\s*:\s*|,?\s+line\s+|,?\s*\(|#L)(?P<line>\d{1,9})\)?(?::\d{1,9})?:?",
    re.IGNORECASE,
)
# How a text writes a place in a file, between the path and the line: ``:135``
# (grep -n, compilers, pytest), ``", line 135`` (a Python traceback), ``(135)`` (pdb),
# `` line 135`` (prose). A regex both in Postgres's ARE and in Python's syntax.
_AT_LINE = r'("?,? ?line |:|\()'


@dataclass(frozen=True, slots=True)
class Query:
    """A search query as the database matches it."""

    words: str  # for the full-text query and the trigram similarity
    literal: str  # what is looked for as written (a substring, any case)
    # A place in a file (the path as written, the line number): the literal is then
    # looked for in any of the ways a text writes it (see :data:`_AT_LINE`).
    location: tuple[str, str] | None = None

    @property
    def has_trigram(self) -> bool:
        """Whether the trigram index can look the literal up: it holds three word
        characters in a row (``ab``, ``日本`` and ``a/b/c.py`` do not, and are looked for
        by reading the session's entries instead)."""
        return _TRIGRAM.search(self.literal) is not None

    @property
    def regex(self) -> str:
        """A regex (Postgres ARE) of the literal, its punctuation escaped: matched with
        ``~*`` (any case), which the trigram index serves, and rechecks faster than
        ``ILIKE``."""
        if self.location is not None:
            path, line = self.location
            return f"{_escaped(path)}{_AT_LINE}{line}($|[^0-9])"
        return _escaped(self.literal)

    @property
    def pattern(self) -> str:
        """The literal as a Python regex (for :func:`snippet`): as written, or a place in
        a file in any of the ways a text writes it."""
        if self.location is not None:
            path, line = self.location
            return f"{re.escape(path)}{_AT_LINE}{line}(?![0-9])"
        return re.escape(self.literal)

    @property
    def alone_regex(self) -> str:
        """A regex (Postgres ARE) of the literal not inside a longer word: no word
        character just before it when it starts with one, nor just after it when it
        ends with one."""
        body = self.regex
        if _is_word_char(self.literal[0]):
            body = f"(^|[^{_WORD_CLASS}]){body}"
        if self.location is None and _is_word_char(self.literal[-1]):
            body = f"{body}($|[^{_WORD_CLASS}])"
        return body


def read_query(q: str) -> Query | None:
    """The query in ``q`` (None: nothing to search for). A query in double quotes is
    looked for without them; whitespace around it does not count."""
    words = clean(q).strip()
    literal = words
    if len(literal) > 2 and literal[0] == literal[-1] == '"':
        literal = literal[1:-1].strip()
    if not literal:
        return None
    if m := _LOCATION.fullmatch(literal):
        path, line = m["path"], m["line"].lstrip("0") or "0"
        # The words: the path's and the line's (not "line", "File"...).
        return Query(words=f"{path} {line}", literal=literal, location=(path, line))
    return Query(words=words, literal=literal)


def _escaped(literal: str) -> str:
    return "".join(f"\\{c}" if c in _PUNCTUATION else c for c in literal)


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


# --- snippets ------------------------------------------------------------------------

# A snippet shows at most this many of the entry's characters (besides the marks).
SNIPPET_CHARS = 600
# Lines of context shown on each side of the matching line (blank ones not counted).
CONTEXT_LINES = 2
# Where a snippet leaves out the rest of a line (" … ") or whole lines (a line "…").
CUT = " … "
_MORE = "…"
# A cut line starts and ends at a space when one is this close.
_SNAP = 16
_WORD = re.compile(r"[^\W_]+")
# Postgres' english stop words: the full-text query ignores them, and so does the
# choice of a word hit's line.
_STOP = (
    "i me my myself we our ours ourselves you your yours yourself yourselves he him his"
    " himself she her hers herself it its itself they them their theirs themselves what"
    " which who whom this that these those am is are was were be been being have has had"
    " having do does did doing a an the and but if or because as until while of at by for"
    " with about against between into through during before after above below to from up"
    " down in out on off over under again further then once here there when where why how"
    " all any both each few more most other some such no nor not only own same so than too"
    " very s t can will just don should now"
)
_STOP_WORDS = frozenset(_STOP.split())


def snippet(text: str, query: str, *, exact: bool = True, pattern: str | None = None) -> str:
    """Whole lines of ``text`` around its best matching line, the matches marked
    «like this», every character as written (no line numbers added: the text's own
    are kept, as in a traceback or ``grep -n``).

    ``exact``: ``query`` is a literal (any case) and the line is the one holding its
    first place; else ``query`` is words and the line is the one holding the most
    distinct of them (stop words aside), the earliest of those. A word is found where
    a word of the line starts with it (a number, or a word of at most 3 letters: is
    it), or with its stem: the word less its last 3 letters, at least 4 (``failing``
    finds ``failed``). ``pattern``: the literal as a regex (:attr:`Query.pattern`: a
    place in a file found however the text writes it). Around that line, up to :data:`CONTEXT_LINES` lines before and
    after while they fit in :data:`SNIPPET_CHARS`; a line too long for it is cut
    around the match (``" … "``), and a line ``…`` stands for the lines left out. No
    match (a case folding Python and Postgres disagree on, a stem Postgres finds and
    this does not): the text's first lines."""
    spans: Sequence[tuple[int, ...]]
    if exact:
        spans = _literal_spans(text, query, pattern)
        start, end = spans[0] if spans else (0, 0)
    else:
        spans = words = _word_spans(text, query)
        start, end = _best_line(text, words)
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    last = len(text) if last < 0 else last
    if last - first > SNIPPET_CHARS:
        lo, hi = _window(text, first, last, start, end)
        return _render(text, lo, hi, spans, first, last)
    used = last - first
    before, after = first, last
    taken_before = taken_after = 0
    more_before = more_after = True
    while more_before or more_after:
        if more_before:
            more_before = False
            if before > 0 and taken_before < CONTEXT_LINES:
                lo = text.rfind("\n", 0, before - 1) + 1
                if used + (before - lo) <= SNIPPET_CHARS:
                    used += before - lo
                    taken_before += bool(text[lo : before - 1].strip())
                    before, more_before = lo, True
        if more_after:
            more_after = False
            if after < len(text) and taken_after < CONTEXT_LINES:
                hi = text.find("\n", after + 1)
                hi = len(text) if hi < 0 else hi
                if used + (hi - after) <= SNIPPET_CHARS:
                    used += hi - after
                    taken_after += bool(text[after + 1 : hi].strip())
                    after, more_after = hi, True
    return _render(text, before, after, spans, before, after)


def _literal_spans(text: str, literal: str, pattern: str | None) -> list[tuple[int, int]]:
    if not literal:
        return []
    regex = pattern if pattern is not None else re.escape(literal)
    return [m.span() for m in re.finditer(regex, text, re.IGNORECASE) if m.end() > m.start()]


def _stems(words: str) -> list[tuple[str, bool]]:
    """The query's words to look for: (a stem, whether a line's word must be it)."""
    found: dict[str, bool] = {}
    for word in _WORD.findall(words.casefold()):
        if word in _STOP_WORDS:
            continue
        if word.isdigit() or len(word) <= 3:
            found.setdefault(word, True)
        else:
            found.setdefault(word[: max(4, len(word) - 3)], False)
    return list(found.items())


def _word_spans(text: str, words: str) -> list[tuple[int, int, int]]:
    """Where ``text`` holds the query's words: (start, end, which of them: a bit each)."""
    stems = _stems(words)
    spans: list[tuple[int, int, int]] = []
    if not stems:
        return spans
    for m in _WORD.finditer(text):
        word = m.group().casefold()
        which = 0
        for i, (stem, whole) in enumerate(stems):
            if word == stem if whole else word.startswith(stem):
                which |= 1 << i
        if which:
            spans.append((m.start(), m.end(), which))
    return spans


def _best_line(text: str, spans: Sequence[tuple[int, int, int]]) -> tuple[int, int]:
    """The first span of the line with the most distinct words (the earliest of them);
    (0, 0) when there is none."""
    best, best_count = (0, 0), 0
    line_end = -1
    line_words = 0
    line_first = (0, 0)
    for start, end, which in spans:
        if start > line_end:
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
            line_words, line_first = 0, (start, end)
        line_words |= which
        if line_words.bit_count() > best_count:
            best, best_count = line_first, line_words.bit_count()
    return best


def _window(text: str, first: int, last: int, start: int, end: int) -> tuple[int, int]:
    """The part of the line ``text[first:last]`` shown around a match at ``start:end``:
    :data:`SNIPPET_CHARS` characters, a third before it, at a space when one is near."""
    lo = max(first, start - SNIPPET_CHARS // 3)
    hi = min(last, lo + SNIPPET_CHARS)
    lo = max(first, hi - SNIPPET_CHARS)
    if lo > first:
        space = text.find(" ", lo, min(start, lo + _SNAP))
        lo = space + 1 if space >= 0 else lo
    if hi < last:
        space = text.rfind(" ", max(end, hi - _SNAP), hi)
        hi = space if space >= 0 else hi
    return lo, hi


def _render(
    text: str, lo: int, hi: int, spans: Sequence[tuple[int, ...]], first: int, last: int
) -> str:
    """``text[lo:hi]``, its spans marked, and where it leaves something out: " … " where
    it starts after ``first`` or ends before ``last`` (inside a line), a line "…" where
    lines before or after it are left out."""
    out: list[str] = []
    if lo > first:
        out.append(CUT.lstrip())
    elif text[:lo].strip():
        out.append(_MORE + "\n")
    at = lo
    for span in spans:
        s, e = max(span[0], at), min(span[1], hi)
        if s < e:
            out += [text[at:s], MARK_START, text[s:e], MARK_END]
            at = e
    out.append(text[at:hi])
    if hi < last:
        out.append(CUT.rstrip())
    elif text[hi:].strip():
        out.append("\n" + _MORE)
    return "".join(out)
