"""app.engine.search_text: what an entry's searchable text holds, its bounds, and how a
query is read (the regexes the database matches, the snippets)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.engine import search_text as st_
from app.engine.search_text import (
    APPEND_CHARS,
    HEAD_CHARS,
    MAX_CHARS,
    TAIL_CHARS,
    for_append,
    read_query,
    search_text,
    snippet,
)


def test_text_reasoning_calls_and_outputs_are_searchable() -> None:
    parts = [
        {"type": "reasoning", "text": "The parser drops ISO weeks."},
        {"type": "text", "text": "Let me look at the parser."},
        {
            "type": "tool_call",
            "id": "c1",
            "name": "bash",
            "arguments": '{"command": "grep -n \\"parse_iso_week\\" src/dates.py\\nls"}',
        },
    ]
    text = search_text(parts)
    assert "The parser drops ISO weeks." in text
    assert "Let me look at the parser." in text
    assert "bash" in text
    # The arguments' JSON decoded: the command as the agent wrote it, no escapes.
    assert 'command: grep -n "parse_iso_week" src/dates.py\nls' in text
    assert "\\n" not in text
    assert '\\"' not in text


def test_arguments_that_are_not_json_are_kept_as_written() -> None:
    text = search_text([{"type": "tool_call", "id": "c", "name": "edit", "arguments": "{oops"}])
    assert text == "edit\n{oops"


def test_nested_arguments_give_their_keys_and_values() -> None:
    args = '{"edits": [{"path": "a/b/c.py", "line": 3, "ok": true}], "flags": ["--flag"]}'
    text = search_text([{"type": "tool_call", "id": "c", "name": "apply", "arguments": args}])
    for piece in ("apply", "edits", "path: a/b/c.py", "line: 3", "--flag"):
        assert piece in text


def test_images_signatures_and_encrypted_blocks_are_left_out() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg"},
        {"type": "reasoning", "redacted": "ZW5jcnlwdGVk"},
        {"type": "reasoning", "text": "thinking", "signature": "c2lnbmF0dXJl"},
        {
            "type": "opaque",
            "format": "anthropic",
            "block": {
                "type": "web_search_tool_result",
                "content": [
                    {
                        "type": "web_search_result",
                        "title": "ISO week date",
                        "url": "https://en.wikipedia.org/wiki/ISO_week_date",
                        "encrypted_content": "RW5jcnlwdGVkIHBhZ2U=",
                    }
                ],
            },
        },
        {
            "type": "opaque",
            "format": "anthropic",
            "block": {"type": "document", "source": {"type": "base64", "data": "JVBERi0x"}},
        },
    ]
    text = search_text(parts)
    assert "thinking" in text
    assert "ISO week date" in text
    assert "https://en.wikipedia.org/wiki/ISO_week_date" in text
    for hidden in ("iVBORw0KGgo", "ZW5jcnlwdGVk", "c2lnbmF0dXJl", "RW5jcnlwdGVk", "JVBERi0x"):
        assert hidden not in text


def test_a_long_output_keeps_its_head_and_its_end() -> None:
    lines = [f"line {i}: ok" for i in range(10_000)] + ["E   ValueError: week 53 is out of range"]
    text = search_text([{"type": "text", "text": "\n".join(lines)}])
    assert len(text) == MAX_CHARS
    assert text.startswith("line 0: ok\nline 1: ok")
    assert text.endswith("ValueError: week 53 is out of range")
    assert text[HEAD_CHARS : HEAD_CHARS + len(st_.ELISION)] == st_.ELISION
    assert len(text) - HEAD_CHARS - len(st_.ELISION) == TAIL_CHARS


def test_nul_and_lone_surrogates_never_reach_the_database() -> None:
    text = search_text(
        [
            {"type": "text", "text": "before\x00after"},
            {"type": "tool_call", "id": "c", "name": "x\x00y", "arguments": '{"a": "b\\u0000c"}'},
            {"type": "text", "text": "bad \ud800 surrogate"},
        ]
    )
    assert "\x00" not in text
    assert "beforeafter" in text
    assert "xy" in text
    assert "a: bc" in text
    assert "bad \ufffd surrogate" in text
    text.encode("utf-8")  # valid UTF-8, as Postgres takes it


_PARTS = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text()),
        st.builds(
            lambda n, a: {"type": "tool_call", "id": "c", "name": n, "arguments": a},
            st.text(max_size=20),
            st.text(),
        ),
        st.builds(lambda t: {"type": "reasoning", "text": t}, st.text()),
    ),
    max_size=6,
)


@given(_PARTS)
def test_always_bounded_nul_free_and_utf8(parts: list[dict[str, str]]) -> None:
    text = search_text(parts)
    assert len(text) <= MAX_CHARS
    assert "\x00" not in text
    text.encode("utf-8")


def _texts(*sizes: int) -> list[list[dict[str, Any]]]:
    return [[{"type": "text", "text": str(k % 10) * size}] for k, size in enumerate(sizes)]


def test_an_append_writes_its_first_entries_text_and_leaves_the_rest_pending() -> None:
    texts, pending = for_append(_texts(100, 200, 300, 10), budget=350)
    # 100 + 200 fit, 300 more do not, and nothing after a pending entry is written.
    assert pending == [False, False, True, True]
    assert texts == ["0" * 100, "1" * 200, "", ""]
    # The first entry is written whatever its size.
    texts, pending = for_append(_texts(500, 10), budget=350)
    assert pending == [False, True]
    assert texts[0] == "0" * 500


@given(st.lists(st.integers(0, 50_000), max_size=40), st.integers(1, 200_000))
def test_the_written_text_is_a_prefix_within_the_budget(sizes: list[int], budget: int) -> None:
    entries = _texts(*sizes)
    texts, pending = for_append(entries, budget=budget)
    assert len(texts) == len(pending) == len(entries)
    written = pending.count(False)
    assert pending == [False] * written + [True] * (len(entries) - written)
    if entries:
        assert written >= 1  # the first entry always
    # Within the budget, but for a first entry longer than it on its own.
    assert sum(map(len, texts)) <= max(budget, len(texts[0]) if texts else 0)
    for parts, text, left in zip(entries, texts, pending, strict=True):
        assert text == ("" if left else search_text(parts))
    # Nothing pending that would have fit.
    if written < len(entries):
        assert sum(map(len, texts)) + len(search_text(entries[written])) > budget


def test_the_default_budget_takes_a_thousand_small_messages_whole() -> None:
    _, pending = for_append(_texts(*[400] * 1000))
    assert not any(pending)
    _, pending = for_append(_texts(*[8_000] * 1000))
    assert pending.count(False) == APPEND_CHARS // 8_000


# --- queries -----------------------------------------------------------------------


def test_a_query_is_trimmed_and_quotes_ask_for_the_literal() -> None:
    q = read_query('  "TypeError: unsupported operand"  ')
    assert q is not None
    assert q.literal == "TypeError: unsupported operand"
    assert read_query("   ") is None
    assert read_query('""') is not None  # two quote marks are a literal of their own
    assert read_query("\x00") is None


def _pg_like(regex: str) -> str:
    """The Postgres ARE as Python reads it (the one class this module writes); the
    API tests match them in Postgres itself."""
    return regex.replace("[^[:alnum:]_]", "\\W")


def test_the_regexes_escape_punctuation_and_bound_word_edges() -> None:
    for literal, inside, alone in [
        ("foo.bar_baz", "xfoo.bar_bazy", "call foo.bar_baz()"),
        ("a/b/c.py", "xa/b/c.pyc", "edit a/b/c.py now"),
        ("--flag", "x--flagged", "run with --flag set"),
        ("parse_iso_week", "my_parse_iso_week", "def parse_iso_week(value):"),
        ("a+b*(c)", "xa+b*(c)y", "= a+b*(c)."),
    ]:
        q = read_query(literal)
        assert q is not None
        found = re.compile(q.regex, re.IGNORECASE)
        assert found.search(inside)
        assert found.search(alone)
        assert not found.search(literal.replace(".", "x", 1)) or "." not in literal
        bounded = re.compile(_pg_like(q.alone_regex), re.IGNORECASE)
        assert bounded.search(alone), (literal, q.alone_regex)
        assert not bounded.search(inside), (literal, q.alone_regex)


def test_which_literals_the_trigram_index_can_look_up() -> None:
    assert read_query("parse_iso_week").has_trigram  # type: ignore[union-attr]
    assert read_query("日本語").has_trigram  # type: ignore[union-attr]
    for short in ("py", "日本", "a/b/c.py", "--"):
        assert not read_query(short).has_trigram  # type: ignore[union-attr]


def test_a_snippet_marks_the_match_and_stays_short() -> None:
    # A long line is cut around the match; the next line, too long to add whole, is
    # left out (more cases: tests/engine/test_search_snippet.py).
    text = ("word " * 400) + "the ImproperlyConfigured error\n\nhere" + (" tail" * 400)
    shown = snippet(text, "improperlyconfigured")
    assert "«ImproperlyConfigured»" in shown
    assert shown.startswith("… ")
    assert shown.endswith("error\n…")
    assert len(shown) <= st_.SNIPPET_CHARS + 10
    assert "\n" not in shown.removesuffix("\n…")
    # Not found (a case folding Python and Postgres disagree on): the text's start.
    assert snippet("short text", "absent") == "short text"
