"""The catalogues of app/engine/compaction/patterns.py against their corpus: every row's
examples match that row and give what the row yields through the code that applies the
table, texts that are none of the shapes match no row, and no table names a row twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from app.engine.compaction import dropped, patterns
from app.engine.compaction.anchors import ErrorLine, error_line_kind, exit_code, outcome, task_terms
from app.engine.compaction.extractive import extractive_summary
from app.engine.compaction.patterns import Shape
from app.engine.model import Entry

TABLES: dict[str, Sequence[Shape[Any]]] = {
    "ERROR_LINES": patterns.ERROR_LINES,
    "EXIT_CODES": patterns.EXIT_CODES,
    "NUMBERS": patterns.NUMBERS,
    "TASK_TERMS": patterns.TASK_TERMS,
    "SENTENCES": patterns.SENTENCES,
}


def examples(table: Sequence[Shape[Any]]) -> list[Any]:
    return [
        pytest.param(row, text, id=f"{row.name}: {text}") for row in table for text in row.examples
    ]


@pytest.mark.parametrize("name", TABLES)
def test_a_table_names_each_row_once_and_gives_each_an_example(name: str) -> None:
    table = TABLES[name]
    names = [row.name for row in table]
    assert len(names) == len(set(names)), name
    assert all(row.examples for row in table), name


# --- Error lines ----------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "line"), examples(patterns.ERROR_LINES))
def test_each_error_line_shape_is_ranked_as_its_row_says(
    row: Shape[patterns.FailureRank], line: str
) -> None:
    assert row.pattern.match(line)
    rank = row.yields.rank
    assert error_line_kind(line, failed=True) == rank
    assert error_line_kind(line, failed=False) == (rank if row.yields.alone else None)
    # In an output: a telling line fails the result by itself, and is the line it gives.
    failed = outcome(f"some output\n  {line}\n", is_error=not row.yields.alone)
    assert failed.failed
    assert failed.lines[0] == ErrorLine(line, rank)


NOT_ERROR_LINES = [
    "All tests passed",
    "collected 3 items",
    "============ 3 passed in 0.12s ============",
    "def test_failure_is_reported():",
    "raise ValueError('x')",
    "error_count = 0",
    "Errors: none",
    "Finished in 0.2s",
    "PASSED tests/test_x.py::test_y",
    "tests/test_x.py::test_y PASSED",
    "ok  \texample.com/pkg\t0.01s",
    "test result: ok. 3 passed; 0 failed",
    "Success: no issues found in 3 source files",
    "Applied patch src/a.py cleanly.",
    "patching file src/a.py",
    "--- a/src/a.py",
    # Near the shell's syntax errors and unittest's summary, but neither.
    "fix the syntax error near the closing paren",
    "bash: -c: line 1: `python -c print(len(x))'",
    "shell: ok",
    "FAILED (see the log above)",
    "OK (skipped=2)",
    "",
]


@pytest.mark.parametrize("line", NOT_ERROR_LINES)
def test_lines_that_are_no_error_shape_match_no_row(line: str) -> None:
    assert not [row.name for row in patterns.ERROR_LINES if row.pattern.match(line)]
    assert error_line_kind(line, failed=True) is None


def test_every_error_line_holds_a_keyword_unless_its_row_is_unkeyed() -> None:
    """The keywords let the scan skip lines with ``str.find``: a row whose lines may hold
    none must be named in UNKEYED, or its lines would be skipped."""
    for row in patterns.ERROR_LINES:
        if row.name not in patterns.UNKEYED:
            for line in row.examples:
                assert any(word in line for word in patterns.KEYWORDS), (row.name, line)


# --- Exit codes -----------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "text"), examples(patterns.EXIT_CODES))
def test_each_exit_code_phrase_gives_the_code_it_says(row: Shape[str], text: str) -> None:
    m = row.pattern.search(text)
    assert m is not None
    said = int(next(g for g in m.groups() if g is not None))
    assert exit_code(text) == said
    assert exit_code(f"some output\n{text}") == said


NO_EXIT_CODE = [
    "exit",
    "Exited normally",
    "the exit code is documented in README.md",
    "returncode",
    "exit code 1.5",
    "we return with code review later",
    "status: 0 passed",
    "exit_code = compute()",
    "",
]


@pytest.mark.parametrize("text", NO_EXIT_CODE)
def test_texts_that_say_no_exit_code_match_no_row(text: str) -> None:
    assert not [row.name for row in patterns.EXIT_CODES if row.pattern.search(text)]
    assert exit_code(text) is None


# --- Numbers --------------------------------------------------------------------------------


def numbers(text: str) -> list[str]:
    found: list[str] = dropped.index([Entry(role="user", parts=[{"type": "text", "text": text}])])[
        "numbers"
    ]["first"]
    return found


@pytest.mark.parametrize(("row", "text"), examples(patterns.NUMBERS))
def test_each_number_shape_is_listed_as_its_row_matches_it(row: Shape[str], text: str) -> None:
    m = row.pattern.search(text)
    assert m is not None
    assert numbers(text) == [m[0]]
    assert numbers(f"took {text} here") == [m[0]]
    if row in patterns.DIGIT_FIRST:
        # Searched as one pattern: this row is the one that finds it.
        joined = patterns.joined(patterns.DIGIT_FIRST, patterns.DIGIT_FIRST_PREFIX)
        found = joined.search(text)
        assert found is not None
        assert found.lastgroup == row.name


NOT_NUMBERS = [
    "3 files",
    "x = 1.5",
    "0 days",
    "step 2 of 4",
    "version2",
    "abc123",
    "a-1234567",
    "sha deadbeef",
    "id",
    "",
]


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_small_or_plain_numbers_are_not_listed(text: str) -> None:
    assert numbers(text) == []


def test_the_number_tables_are_searched_as_one_pattern_each() -> None:
    assert (
        patterns.joined(patterns.DIGIT_FIRST, patterns.DIGIT_FIRST_PREFIX) == dropped._DIGIT_FIRST
    )
    assert patterns.joined(patterns.SIGN_FIRST) == dropped._SIGN_FIRST


# --- Task terms -----------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "text"), examples(patterns.TASK_TERMS))
def test_each_task_term_shape_is_kept_as_its_group_reads_it(row: Shape[str], text: str) -> None:
    m = patterns.joined(patterns.TASK_TERMS).match(text)
    assert m is not None
    assert m.lastgroup == row.name
    assert m.end() == len(text)
    assert task_terms(text) == [m[row.name]]
    assert task_terms(f"Please look at {text} first.") == [m[row.name]]


NOT_TASK_TERMS = [
    "the quick brown fox jumps over the lazy dog",
    "e.g. this, etc",
    "a b c",
    "version 2 of it",
    "12 apples",
    "I'm done",
    "",
]


@pytest.mark.parametrize("text", NOT_TASK_TERMS)
def test_plain_words_are_no_task_terms(text: str) -> None:
    assert task_terms(text) == []


# --- Sentences the extractive summary quotes ------------------------------------------------

SECTIONS = {
    "constraints": "## Constraints & Preferences",
    "decisions": "## Key Decisions",
    "critical": "## Critical Context",
    "next": "## Next Steps",
}


def section(summary: str, heading: str) -> str:
    start = summary.index(heading) + len(heading)
    end = summary.find("\n## ", start)
    return summary[start : end if end >= 0 else len(summary)]


@pytest.mark.parametrize(("row", "sentence"), examples(patterns.SENTENCES))
def test_each_sentence_shape_is_quoted_in_its_section(row: Shape[str], sentence: str) -> None:
    assert row.pattern.search(sentence)
    said = sentence[0].upper() + sentence[1:]
    user, agent = ("Fix the parser. " + said, "Working on it.")
    if row.yields != "constraints":
        user, agent = "Fix the parser.", "Working on it. " + said
    entries = [
        Entry(role="user", parts=[{"type": "text", "text": user}]),
        Entry(role="assistant", parts=[{"type": "text", "text": agent}]),
    ]
    assert f"- {said}" in section(extractive_summary(entries), SECTIONS[row.yields])


NOT_SENTENCES = [
    "the tests pass now.",
    "here is the output of the run.",
    "thanks!",
    "mustard is yellow.",
    "",
]


@pytest.mark.parametrize("sentence", NOT_SENTENCES)
def test_plain_sentences_match_no_sentence_shape(sentence: str) -> None:
    assert not [row.name for row in patterns.SENTENCES if row.pattern.search(sentence)]
