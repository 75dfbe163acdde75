"""The plain text of an entry that recall searches (``entry.search_text``).

Computed once, when the entry is written, from its parts: the text parts, readable
reasoning, each tool call's name and arguments (their JSON decoded, so that a
command or a path reads as the agent wrote it, not with ``\\n`` and ``\\"``
escapes), a tool result's output (its text parts), and the words of opaque blocks
(a document's text, a search result's title and URL...). Images, signatures and
encrypted content are left out: they are not words anyone searches for.

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


def search_text(parts: Sequence[Mapping[str, Any]]) -> str:
    """The searchable text of an entry with these parts: bounded, NUL-free, valid
    UTF-8 (a lone surrogate becomes U+FFFD)."""
    return clean(bound("\n".join(piece for piece in _pieces(parts) if piece)))


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
SNIPPET_CHARS = 300
MARK_START = "«"
MARK_END = "»"
_PUNCTUATION = frozenset(string.punctuation)
_SPACES = re.compile(r"\s+")
_TRIGRAM = re.compile(r"[^\W_]{3}")


@dataclass(frozen=True, slots=True)
class Query:
    """A search query as the database matches it."""

    words: str  # for the full-text query and the trigram similarity
    literal: str  # what is looked for as written (a substring, any case)

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
        return "".join(f"\\{c}" if c in _PUNCTUATION else c for c in self.literal)

    @property
    def alone_regex(self) -> str:
        """A regex (Postgres ARE) of the literal not inside a longer word: no word
        character just before it when it starts with one, nor just after it when it
        ends with one."""
        body = self.regex
        if _is_word_char(self.literal[0]):
            body = f"(^|[^{_WORD_CLASS}]){body}"
        if _is_word_char(self.literal[-1]):
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
    return Query(words=words, literal=literal)


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def snippet(text: str, literal: str) -> str:
    """About :data:`SNIPPET_CHARS` characters of ``text`` around the first place it
    holds ``literal`` (any case), marked; the text's start when it holds none."""
    found = re.search(re.escape(literal), text, re.IGNORECASE)
    if found is None:
        return _tidy(text[:SNIPPET_CHARS]) + (" …" if len(text) > SNIPPET_CHARS else "")
    start, end = found.span()
    shown = min(end, start + SNIPPET_CHARS)
    room = max(0, SNIPPET_CHARS - (shown - start))
    lo = max(0, start - room // 3)
    hi = min(len(text), shown + room - (start - lo))
    out = [
        "… " if lo > 0 else "",
        _tidy(text[lo:start]),
        MARK_START,
        _tidy(text[start:shown]),
        MARK_END,
        _tidy(text[shown:hi]),
        " …" if hi < len(text) else "",
    ]
    return "".join(out).strip()


def headline(text: str) -> str:
    """A snippet Postgres marked (``ts_headline``), tidied and bounded like
    :func:`snippet`'s."""
    tidy = _tidy(text).strip()
    if len(tidy) > SNIPPET_CHARS + 100:
        tidy = tidy[: SNIPPET_CHARS + 100] + " …"
    if tidy.count(MARK_START) > tidy.count(MARK_END):
        tidy += MARK_END
    return tidy


def _tidy(text: str) -> str:
    return _SPACES.sub(" ", text)
