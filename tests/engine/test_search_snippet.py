"""app.engine.search_text.snippet: whole lines around the best matching line of an
entry's searchable text, from anywhere in it, every character kept, the matches
marked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.engine.search_text import MARK_END, MARK_START, SNIPPET_CHARS, read_query, snippet

TRACEBACK = (
    "Traceback (most recent call last):\n"
    + "".join(
        f'  File "/srv/app/lib/mod{i}.py", line {10 + i}, in step{i}\n    step{i + 1}()\n'
        for i in range(12)
    )
    + '  File "/srv/app/lib/registry.py", line 135, in <module>\n'
    + "    register(name)\n"
    + '  File "<string>", line 1, in <lambda>\n'
    + "KeyError: 'plugin'\n"
)


def unmarked(shown: str) -> str:
    return shown.replace(MARK_START, "").replace(MARK_END, "")


def test_a_word_hit_shows_the_line_with_the_most_query_words() -> None:
    shown = snippet(TRACEBACK, "registry.py line 135", exact=False)
    # The traceback's frame, not its top; every character of the lines kept.
    assert '  File "/srv/app/lib/«registry».«py»", «line» «135», in <module>' in shown
    assert "Traceback" not in shown
    # Two lines of context on each side, and where lines are left out.
    assert shown.startswith("…\n")
    assert '  File "<string>", line 1, in <lambda>' in unmarked(shown)
    assert "KeyError" not in shown
    assert shown.endswith("\n…")
    lines = unmarked(shown).split("\n")
    assert lines[1:-1] == TRACEBACK.split("\n")[23:28]


def test_an_exact_hit_shows_the_line_of_its_first_place() -> None:
    shown = snippet(TRACEBACK, 'registry.py", LINE 135')
    assert 'File "/srv/app/lib/«registry.py", line 135», in <module>' in shown
    assert "    register(name)" in shown
    assert '"<string>"' in shown
    # Every place it is in the shown lines is marked.
    shown = snippet(TRACEBACK, "<module>")
    assert shown.count("«<module>»") == 1
    assert "line 135, in «<module>»" in shown


def test_a_failed_line_at_the_end_of_a_long_output_is_shown() -> None:
    tests = "".join(f"test_case_{i:05d} (tests.test_mod.Case) ... ok\n" for i in range(500))
    output = tests[:20_000] + (
        "\n======\nFAIL: test_last\n------\nRan 501 tests in 3.2s\n\nFAILED (failures=1)\n"
    )
    assert len(output) > 20_000
    shown = snippet(output, "FAILED failures", exact=False)
    assert "«FAILED» («failures»=1)" in shown
    assert "Ran 501 tests in 3.2s" in shown  # the lines before, blank ones not counted
    assert shown.startswith("…\n")
    assert not shown.endswith("…")  # nothing but a newline after it
    assert "FAILED «(failures=1)»" in snippet(output, "(FAILURES=1)")
    assert len(unmarked(shown)) <= SNIPPET_CHARS + 4


def test_a_long_line_is_cut_around_the_match() -> None:
    line = ("word " * 400) + "the ImproperlyConfigured error" + (" tail" * 400)
    text = "first line\n" + line + "\nlast line"
    shown = snippet(text, "improperlyconfigured")
    assert "«ImproperlyConfigured»" in shown
    assert shown.startswith("… word ")
    assert shown.endswith(" tail …")
    assert "\n" not in shown
    assert SNIPPET_CHARS - 40 <= len(unmarked(shown)) <= SNIPPET_CHARS + 4
    # About a third before the match.
    before = unmarked(shown).index("ImproperlyConfigured")
    assert SNIPPET_CHARS // 4 <= before <= SNIPPET_CHARS // 2
    # A match at a long line's end: the room goes before it.
    shown = snippet("x " * 1000 + "needle", "needle")
    assert shown.endswith("«needle»")
    assert len(unmarked(shown)) >= SNIPPET_CHARS - 20


def test_lines_that_do_not_fit_are_left_out_whole() -> None:
    text = "a" * 700 + "\nthe match here\n" + "b" * 700
    assert snippet(text, "match") == "…\nthe «match» here\n…"


def test_whitespace_is_kept_as_written() -> None:
    text = "def f():\n\tif  x:\n        return   «y»\n"
    shown = snippet(text, "return", exact=False)
    assert shown == "def f():\n\tif  x:\n        «return»   «y»\n"


def test_no_match_shows_the_first_lines() -> None:
    text = "one\ntwo\nthree\nfour\nfive"
    assert snippet(text, "absent") == "one\ntwo\nthree\n…"
    assert snippet(text, "absent words", exact=False) == "one\ntwo\nthree\n…"
    assert snippet("", "absent") == ""
    assert snippet("short text", "absent") == "short text"


def test_word_hits_match_stems_and_ignore_stop_words() -> None:
    text = "the parser is here\nnothing\nThe test failed twice on the runners\n"
    assert snippet(text, "failing runner", exact=False).startswith(
        "the parser is here\nnothing\nThe test «failed» twice on the «runners»"
    )
    # Ties: the earliest line; stop words do not count.
    text = "alpha one\nbeta\nthe alpha of the one\n"
    shown = snippet(text, "the alpha", exact=False)
    assert shown.startswith("«alpha» one")
    # Short words and numbers are whole: 13 is not 135.
    text = "line 1350 here\nline 135 there\n"
    assert "«line» «135» there" in snippet(text, "line 135", exact=False)


@given(
    st.text(alphabet=st.sampled_from("ab \n\t<>«»é"), max_size=3000),
    st.text(alphabet=st.sampled_from("ab <"), min_size=1, max_size=5),
    st.booleans(),
)
def test_a_snippet_is_bounded_and_its_lines_are_the_texts(text: str, q: str, exact: bool) -> None:
    shown = snippet(text, q, exact=exact)
    assert len(shown) <= SNIPPET_CHARS + 2 * len(" … ") + 2 * shown.count(MARK_START) * 2 + 10
    body = shown.removeprefix("…\n").removesuffix("\n…").removeprefix("… ").removesuffix(" …")
    # What is shown is the text's own characters, marks aside.
    if MARK_START not in text and MARK_END not in text:
        assert unmarked(body) in text


def test_a_place_in_a_file_is_found_however_the_text_writes_it() -> None:
    forms = ("registry.py:135", "registry.py line 135", "registry.py:135:9", "registry.py(135)")
    for q in (*forms, 'File "/srv/app/lib/registry.py", line 135', "registry.py#L135"):
        query = read_query(q)
        assert query is not None
        assert query.location is not None, q
        assert query.location[1] == "135"
        shown = snippet(TRACEBACK, query.literal, pattern=query.pattern)
        assert 'registry.py", line 135», in <module>' in shown, q
        assert "«" in shown.split("\n")[3]
    for text in ("lib/registry.py:135: in load", "registry.py(135)<module>()"):
        query = read_query("registry.py line 135")
        assert query is not None
        assert "«registry.py" in snippet(text, query.literal, pattern=query.pattern)
    # Another line, or no line at all: not a place.
    query = read_query("registry.py:13")
    assert query is not None
    assert "«" not in snippet(TRACEBACK, query.literal, pattern=query.pattern)
    for q in ("registry.py", "foo:135", "line 135", "a.b"):
        parsed = read_query(q)
        assert parsed is not None
        assert parsed.location is None, q
