"""Ingest truncation of tool results by output category."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.window.truncate import (
    CATEGORIES,
    DEFAULT_CATEGORIES,
    Category,
    Truncation,
    category_for,
    truncate,
)

NOTICE = re.compile(r"\[\.\.\. (\d+) lines? / (\d+) bytes omitted \.\.\.\]")
GAP_IN_MIDDLE = ("head_tail", "file_content")
CAP = 4_000  # tokens, the default
BUDGET = CAP * 4  # characters


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def lines_touched(text: str) -> int:
    """Lines of ``text`` shown only in part or not at all once ``text`` is cut out."""
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def split(original: str, result: Truncation, category: Category) -> tuple[str, str]:
    """The kept head and tail of a truncated result, after checking that the result
    is exactly head + notice + tail and that the notice's numbers are those of the
    text between them: kept head + omitted + kept tail == original."""
    assert result.truncated
    notices = list(NOTICE.finditer(result.text))
    assert notices, result.text[-200:]
    notice = notices[0] if category in GAP_IN_MIDDLE else notices[-1]
    assert (int(notice[1]), int(notice[2])) == (result.omitted_lines, result.omitted_bytes)
    before, after = result.text[: notice.start()], result.text[notice.end() :]
    if category in GAP_IN_MIDDLE and after:
        assert after[0] == "\n"  # the tail starts on its own line
        tail = after[1:]
    else:
        assert after == "", "the notice ends the result"
        tail = ""
    heads = [before]
    # A head cut inside a line gets a newline so the notice starts on its own line.
    if before.endswith("\n") and before[:-1] and not before[:-1].endswith("\n"):
        heads.append(before[:-1])
    for head in heads:
        if len(head) + len(tail) >= len(original):
            continue
        if not (original.startswith(head) and original.endswith(tail)):
            continue
        omitted = original[len(head) : len(original) - len(tail)]
        if (lines_touched(omitted), utf8_len(omitted)) == (
            result.omitted_lines,
            result.omitted_bytes,
        ):
            return head, tail
    raise AssertionError("the result is not head + notice + tail of the original")


def check(original: str, category: Category, cap: int) -> tuple[Truncation, str, str]:
    result = truncate(original, category, cap)
    head, tail = split(original, result, category)
    assert len(head) + len(tail) <= cap * 4  # the notice is the only excess
    end_of_head, start_of_tail = len(head), len(original) - len(tail)
    assert not (head.endswith("\r") and original[end_of_head] == "\n"), "CR kept without LF"
    assert not (tail.startswith("\n") and original[start_of_tail - 1] == "\r"), "LF without CR"
    if category not in GAP_IN_MIDDLE:
        assert tail == ""
    return result, head, tail


def at_line_start(original: str, position: int) -> bool:
    return position == 0 or original[position - 1] == "\n"


# Realistic outputs.


def pytest_log(tests: int = 900) -> str:
    lines = ["$ python -m pytest -q tests/", "============ test session starts ============"]
    lines += [f"tests/test_module_{i // 50}.py::test_case_{i} PASSED" for i in range(tests)]
    lines += [
        "================= FAILURES =================",
        "E   AssertionError: assert 3 == 4",
        f"========== 1 failed, {tests - 1} passed in 12.34s ==========",
    ]
    return "\n".join(lines) + "\n"


def compiler_log(lines: int = 400) -> str:
    """Long lines: the first 60 and last 40 do not fit in the budget."""
    body = [
        f"src/engine/module_{i}.rs:{i}:5: warning: unused variable `value_{i}` "
        + "note: " * 60
        + f"help: prefix it with an underscore ({i})"
        for i in range(lines)
    ]
    return "\n".join([*body, "error: could not compile `engine` due to 3 previous errors"])


def grep_output(matches: int = 3000) -> str:
    return "".join(
        f"src/app/module_{i % 97}.py:{i}:    result = compute_value(item_{i}, cache)\n"
        for i in range(matches)
    )


def source_file(functions: int = 600) -> str:
    head = '"""A module."""\n\nfrom __future__ import annotations\n\nimport os\nimport sys\n\n'
    body = "".join(
        f"def function_{i}(value: int) -> int:\n    return value * {i} + len(os.sep)\n\n\n"
        for i in range(functions)
    )
    return head + body + 'if __name__ == "__main__":\n    sys.exit(function_1(2))\n'


def test_head_tail_keeps_first_60_and_last_40_lines() -> None:
    log = pytest_log()
    assert len(log) > BUDGET
    result, head, tail = check(log, "head_tail", CAP)
    lines = log.splitlines(keepends=True)
    assert head == "".join(lines[:60])
    assert tail == "".join(lines[-40:])
    assert result.omitted_lines == len(lines) - 100
    assert result.text.startswith("$ python -m pytest")
    assert result.text.endswith("1 failed, 899 passed in 12.34s ==========\n")
    assert len(result.text) <= BUDGET  # the notice fits when the cap is realistic


def test_head_tail_shrinks_long_lines_proportionally() -> None:
    log = compiler_log()
    lines = log.splitlines(keepends=True)
    assert len("".join(lines[:60] + lines[-40:])) > BUDGET
    result, head, tail = check(log, "head_tail", CAP)
    assert at_line_start(log, len(head))
    assert at_line_start(log, len(log) - len(tail))
    head_lines, tail_lines = head.count("\n"), len(tail.splitlines())
    assert 0 < head_lines < 60
    assert 0 < tail_lines < 40
    assert tail.endswith("due to 3 previous errors")  # the final result stays visible
    longest = max(map(len, lines))
    assert len(head) + len(tail) > BUDGET - 2 * longest  # the budget is used, not wasted
    assert abs(len(head) - 1.5 * len(tail)) < 3 * longest  # about 60:40
    assert len(result.text) <= BUDGET


def test_head_tail_head_takes_back_what_the_tail_leaves() -> None:
    # Long build lines first, then short ones: 60% of the budget is not enough for
    # the first 60 lines, but the last 40 need so little that all 60 fit.
    log = "".join(f"[{i:3}] " + "step " * 40 + "\n" for i in range(100)) + "ok\n" * 1000
    lines = log.splitlines(keepends=True)
    assert len("".join(lines[:60])) > BUDGET * 0.6
    _, head, tail = check(log, "head_tail", CAP)
    assert head == "".join(lines[:60])
    assert tail == "ok\n" * 40


def test_match_list_keeps_leading_whole_lines() -> None:
    output = grep_output()
    result, head, _ = check(output, "match_list", CAP)
    assert output.startswith(head)
    assert head.endswith("\n")
    next_line = output[len(head) : output.index("\n", len(head)) + 1]
    assert len(head) + len(next_line) > BUDGET - 64  # as many as fit beside the notice
    assert result.omitted_lines == output.count("\n") - head.count("\n")
    assert result.text.endswith("bytes omitted ...]")
    assert len(result.text) <= BUDGET


def test_file_content_balances_head_and_tail() -> None:
    source = source_file()
    result, head, tail = check(source, "file_content", CAP)
    assert head.startswith('"""A module."""')
    assert "import sys\n" in head
    assert tail.endswith("sys.exit(function_1(2))\n")
    assert at_line_start(source, len(head))
    assert at_line_start(source, len(source) - len(tail))
    longest = max(map(len, source.splitlines(keepends=True)))
    assert abs(len(head) - len(tail)) <= 2 * longest
    assert len(head) + len(tail) > BUDGET - 3 * longest
    assert len(result.text) <= BUDGET


def test_generic_cuts_at_the_last_line_boundary() -> None:
    output = "".join(
        f'{{"id": {i}, "name": "item {i}", "tags": ["a", "b"]}}\n' for i in range(2000)
    )
    result, head, _ = check(output, "generic", CAP)
    assert head.endswith("}\n")
    assert len(head) > BUDGET - 100
    assert len(result.text) <= BUDGET


def test_generic_cuts_by_characters_when_the_boundary_is_far_back() -> None:
    # A short first line, then one huge line: cutting at the line boundary would
    # show almost nothing, so the cut goes by characters.
    output = "HTTP/1.1 200 OK\n" + '{"data": "' + "z" * 100_000 + '"}'
    _, head, _ = check(output, "generic", CAP)
    assert len(head) > BUDGET - 100
    assert head.count("\n") == 1
    # A list of matches keeps whole lines only.
    _, matches, _ = check(output, "match_list", CAP)
    assert matches == "HTTP/1.1 200 OK\n"


# Unchanged under the budget.


@pytest.mark.parametrize("category", CATEGORIES)
def test_text_within_budget_is_returned_unchanged(category: Category) -> None:
    for text in ("", "ok\n", "x" * BUDGET, "é" * BUDGET, pytest_log(10)):
        result = truncate(text, category, CAP)
        assert result.text is text
        assert (result.omitted_lines, result.omitted_bytes, result.truncated) == (0, 0, False)
    assert truncate("x" * (BUDGET + 1), category, CAP).truncated


@pytest.mark.parametrize("cap", [0, -1])
def test_cap_zero_or_less_means_no_truncation(cap: int) -> None:
    text = pytest_log()
    for category in CATEGORIES:
        assert truncate(text, category, cap).text is text


# Line endings, giant lines, Unicode.


@pytest.mark.parametrize("category", CATEGORIES)
def test_crlf_line_endings_are_never_split(category: Category) -> None:
    log = pytest_log().replace("\n", "\r\n")
    _, head, tail = check(log, category, CAP)
    assert head.endswith("\r\n")
    assert tail == "" or (tail.endswith("\r\n") and at_line_start(log, len(log) - len(tail)))
    # Cuts by characters through giant lines slide across every CRLF; check()
    # asserts that none keeps a CR without its LF or an LF without its CR.
    for size in range(120):
        check("b" * size + "\r\n" + "c" * 200 + "\r\n", category, 20)
        check("a\r\n" + "b" * 200 + "\r\n" + "c" * size + "\r\n", category, 20)
        for cap in range(1, 5):  # tails of one character
            check("b" * (size + 20) + "\r\n", category, cap)


@pytest.mark.parametrize("category", CATEGORIES)
def test_no_trailing_newline(category: Category) -> None:
    log = pytest_log().rstrip("\n")
    result, head, tail = check(log, category, CAP)
    if category in GAP_IN_MIDDLE:
        assert tail.endswith("in 12.34s ==========")
    else:
        # the last omitted line has no newline and still counts
        assert result.omitted_lines == log.count("\n") - head.count("\n") + 1


@pytest.mark.parametrize("category", CATEGORIES)
def test_a_single_megabyte_line_is_cut_by_characters(category: Category) -> None:
    line = "0123456789abcdef" * 65_536  # 1 MiB, no newline
    result, head, tail = check(line, category, CAP)
    assert result.omitted_lines == 1
    assert result.omitted_bytes == len(line) - len(head) - len(tail)
    assert len(head) + len(tail) > BUDGET - 100
    assert len(result.text) <= BUDGET
    if category in GAP_IN_MIDDLE:
        assert tail
        assert line.endswith(tail)
        assert result.text.count("\n") == 2  # the notice sits on its own line


@pytest.mark.parametrize("category", GAP_IN_MIDDLE)
def test_a_giant_first_line_takes_what_the_tail_leaves(category: Category) -> None:
    output = "x" * 100_000 + "\n" + "ok\n" * 10
    _, head, tail = check(output, category, CAP)
    assert tail == "ok\n" * 10
    assert len(head) > BUDGET - 100
    assert "\n" not in head


@pytest.mark.parametrize("category", CATEGORIES)
def test_multibyte_characters_are_counted_in_utf8_bytes(category: Category) -> None:
    lines = [f"{i}: héllo wörld — ✓ 日本語 😀" for i in range(2000)]
    text = "\n".join(lines)
    result, head, tail = check(text, category, CAP)
    omitted = text[len(head) : len(text) - len(tail)]
    assert result.omitted_bytes == len(omitted.encode()) > len(omitted)


def test_exact_numbers_on_a_small_example() -> None:
    text = "".join(f"{i}\n" for i in range(10)) + "€€€€"  # 20 ASCII chars, then 12 bytes
    result = truncate(text, "match_list", 4)  # 16 characters, 8 after the notice
    assert result.text == "0\n1\n2\n3\n[... 7 lines / 24 bytes omitted ...]"
    assert (result.omitted_lines, result.omitted_bytes) == (7, 12 + 12)


@pytest.mark.parametrize(
    ("category", "head", "tail"),
    [("head_tail", 12, 8), ("match_list", 20, 0), ("file_content", 10, 10), ("generic", 20, 0)],
)
def test_exact_shares_of_empty_lines(category: Category, head: int, tail: int) -> None:
    # 100 empty lines, cap 10 (40 characters): the notice takes more than half, so
    # 20 characters are kept; head_tail splits them 60:40, file_content 50:50.
    text = "\n" * 100
    gap = "[... 80 lines / 80 bytes omitted ...]" + ("\n" if tail else "")
    assert truncate(text, category, 10).text == "\n" * head + gap + "\n" * tail


def test_lone_surrogates_do_not_crash() -> None:
    # json.loads turns "\ud800" escapes into lone surrogates.
    text = "\ud800 bad\n" * 5000
    for category in CATEGORIES:
        check(text, category, 100)


# Categories by tool name.


def test_default_categories() -> None:
    assert set(DEFAULT_CATEGORIES.values()) <= set(CATEGORIES)
    assert all(name == name.lower() for name in DEFAULT_CATEGORIES)
    expected: dict[Category, list[str]] = {
        "head_tail": ["bash", "shell", "run_terminal_command", "execute_command", "gdb_command"],
        "match_list": ["grep", "rg", "glob", "ls", "search_codebase", "read_lints", "grep_search"],
        "file_content": ["read", "read_file", "view", "cat", "fs", "str_replace_based_edit_tool"],
        "generic": ["web_fetch", "todo_write", "edit_file", "task"],
    }
    for category, names in expected.items():
        for name in names:
            assert category_for(name) == category, name


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("Bash", "head_tail"),
        ("READ_FILE", "file_content"),
        ("mcp__fs__read_file", "file_content"),
        ("mcp__github__search_code", "generic"),
        ("functions.bash", "head_tail"),
        ("container.exec", "head_tail"),
        ("tools/grep", "match_list"),
        ("mcp__tools__Grep", "match_list"),
        ("weird.", "generic"),
        ("", "generic"),
        (None, "generic"),
    ],
)
def test_category_for_names(name: str | None, category: Category) -> None:
    assert category_for(name) == category


def test_overrides_win_exact_then_lower_case() -> None:
    overrides = {"Bash": "generic", "my_tool": "match_list", "mcp__x__log": "head_tail"}
    assert category_for("Bash", overrides) == "generic"
    assert category_for("bash", overrides) == "head_tail"  # exact "Bash" does not cover "bash"
    assert category_for("MY_TOOL", overrides) == "match_list"
    assert category_for("mcp__x__log", overrides) == "head_tail"
    assert category_for("mcp__y__my_tool", overrides) == "match_list"  # by last segment
    assert category_for("grep", {"grep": "file_content"}) == "file_content"


def test_invalid_override_is_generic() -> None:
    assert category_for("grep", {"grep": "sideways"}) == "generic"
    assert category_for("grep", {"grep": ""}) == "generic"


# Properties.

LINES = st.lists(
    st.text(alphabet="ab é日😀\r\t", max_size=30).map(lambda s: s.replace("\r", "\r\n")),
    max_size=120,
)
TEXTS = st.one_of(
    st.text(max_size=400),
    st.text(alphabet="x\n\r", max_size=400),
    st.builds(lambda lines, end: "\n".join(lines) + end, LINES, st.sampled_from(["", "\n"])),
)


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.sampled_from(CATEGORIES), st.integers(min_value=1, max_value=80))
def test_reconstruction_and_size_bound(text: str, category: Category, cap: int) -> None:
    if len(text) <= cap * 4:
        assert truncate(text, category, cap).text is text
        return
    result, head, tail = check(text, category, cap)
    assert result.omitted_bytes > 0
    if category == "head_tail":
        assert len(head.splitlines()) <= 60
        assert len(tail.splitlines()) <= 40
    if category == "match_list":  # whole lines, unless the first line alone is too long
        assert head.endswith("\n") or "\n" not in head


# Speed: measured and recorded, never asserted (benchmarks do not fail on time).


def megabyte_outputs() -> dict[str, str]:
    log = "".join(
        f"2024-05-01T12:00:{i % 60:02d} INFO compiling src/module_{i}.rs ... ok\n"
        for i in range(20_000)
    )[:1_000_000]
    return {"ascii": log, "unicode": log.replace("ok", "✓é"), "one line": "x" * 1_000_000}


def test_megabyte_outputs(request: pytest.FixtureRequest) -> None:
    # Kept as user properties (JUnit XML with junit_family=legacy), not printed.
    properties = request.node.user_properties
    for kind, text in megabyte_outputs().items():
        for category in CATEGORIES:
            started = time.perf_counter()
            result = truncate(text, category, CAP)
            elapsed = time.perf_counter() - started
            properties.append((f"{kind}/{category} MB/s", round(len(text) / 1e6 / elapsed)))
            head, tail = split(text, result, category)
            assert len(result.text) <= BUDGET
            assert head
            assert bool(tail) == (category in GAP_IN_MIDDLE)
