"""What a compaction must not make the agent forget: failures and task terms
(app/engine/compaction/anchors.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction import anchors
from app.engine.compaction.anchors import (
    clip_keeping_anchors,
    exit_code,
    failures,
    is_resolved,
    latest_unresolved_error,
    outcome,
    task_terms,
)
from app.engine.formats.openai_format import parse_message
from app.engine.model import Entry
from tests.traces import load, trace_files

PROPERTY = settings(max_examples=300, deadline=None)


def text(s: str) -> dict[str, str]:
    return {"type": "text", "text": s}


def call(call_id: str, command: str, name: str = "bash") -> Entry:
    arguments = json.dumps({"command": command})
    return Entry(
        role="assistant",
        parts=[{"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}],
    )


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> Entry:
    return Entry(
        role="assistant",
        parts=[
            {"type": "tool_call", "id": call_id, "name": name, "arguments": json.dumps(arguments)}
        ],
    )


def result(call_id: str, output: str, *, is_error: bool = False) -> Entry:
    return Entry(role="tool", parts=[text(output)], tool_call_id=call_id, is_error=is_error)


def run(*steps: tuple[str, str]) -> list[Entry]:
    """A history of shell calls, each followed by its output."""
    entries: list[Entry] = [Entry(role="user", parts=[text("Fix it.")])]
    for k, (command, output) in enumerate(steps):
        entries += [call(f"c{k}", command), result(f"c{k}", output)]
    return entries


def rc(code: int, output: str = "") -> str:
    """An output as mini-swe-agent writes it."""
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


def lines_of(output: str, **kwargs: Any) -> list[str]:
    return [line.text for line in outcome(output, **kwargs).lines]


# --- Exit codes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "code"),
    [
        ("<returncode>2</returncode>\n<output>\n</output>", 2),
        ("done\nexit code 2", 2),
        ("done\nExit code: 1", 1),
        ("done\nexit status 1", 1),
        ("done\nExit status: 3", 3),
        ("done\nexited with code 1", 1),
        ("Process exited with code 1", 1),
        ("Command exited with non-zero status 4", 4),
        ("CompletedProcess(args=['x'], returncode=1)", 1),
        ("returncode=1", 1),
        ("return code: 7", 7),
        ("[exit 1]", 1),
        ("output\n[exit code: 1]", 1),
        ("command failed with exit status 1", 1),
        ("killed\nexit code -9", -9),
        ("done\nexit code 0", 0),
        ("Process exited with code 0", 0),
        ("<returncode>0</returncode>\n<output>\nexit code 2\n</output>", 0),  # the tag wins
        ("plain output", None),
        ("", None),
        ("exit 1", None),  # a script's last line, not a report
        ("the exit code 2 means bad usage, see the manual for more about it", None),
        ("sys.exit(1)", None),
    ],
)
def test_exit_codes(output: str, code: int | None) -> None:
    assert exit_code(output) == code


def test_an_exit_code_is_looked_for_at_the_ends_only() -> None:
    middle = "x\n" * 500 + "exit code 2\n" + "y\n" * 500
    assert exit_code(middle) is None
    assert exit_code(middle + "Exit code: 1") == 1
    assert exit_code("Exit code: 1\n" + middle) == 1


@pytest.mark.parametrize(
    "output",
    ["done\nexit code 0", "Process exited with code 0", rc(0, "all good\n"), "plain output"],
)
def test_zero_and_no_code_are_not_failures(output: str) -> None:
    assert not outcome(output).failed


@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("building\nsomething went wrong\nexit code 2", "something went wrong"),
        ("Process exited with code 1", "Process exited with code 1"),
        (rc(1), "<returncode>1</returncode>"),
        ("make: *** [all] Error 2\n[exit 2]", "make: *** [all] Error 2"),
    ],
)
def test_a_failing_exit_without_an_error_line_is_told_by_its_last_line(
    output: str, line: str
) -> None:
    result = outcome(output)
    assert result.failed
    assert lines_of(output)[0] == line


def test_nothing_found_is_not_a_failure() -> None:
    assert not outcome(rc(1), command="grep -n foo a.py").failed
    assert not outcome(rc(1), command="cd /r && find . -name '*.py' | grep -i person").failed
    assert not outcome(rc(1, "1c1\n< a\n---\n> b\n"), command="diff a b").failed
    # Exit 2 of grep is an error; exit 1 of anything else is a failure.
    assert outcome(rc(2, "grep: a.py: No such file or directory\n"), command="grep x a.py").failed
    assert outcome(rc(1), command="python x.py").failed
    assert outcome(rc(1), command="grep x a.py | python check.py").failed


# --- Error lines -----------------------------------------------------------------------

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/testbed/manage.py", line 22, in <module>\n'
    "    main()\n"
    '  File "/testbed/app/settings.py", line 8, in main\n'
    "    configure(x)\n"
    "    ^^^^^^^^^^^^\n"
)


@pytest.mark.parametrize(
    "exception",
    [
        "django.core.exceptions.ImproperlyConfigured: Requested setting INSTALLED_APPS",
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='x', port=443)",
        "KeyError: 'x'",
        "AssertionError",
        "StopIteration",
        "KeyboardInterrupt",
        "marshmallow.exceptions.ValidationError: {'bar': ['Not a valid mapping type.']}",
        "TypeError: 'NoneType' object is not subscriptable",
        "SystemExit: 2",
    ],
)
def test_a_traceback_gives_its_exception_of_any_name_and_its_last_frame(exception: str) -> None:
    output = rc(1, TRACEBACK + exception + "\n")
    assert lines_of(output) == [exception, 'File "/testbed/app/settings.py", line 8, in main']
    # A traceback tells a failure even when the command exits 0 (the exception printed).
    assert lines_of("<returncode>0</returncode>\n" + TRACEBACK + exception)[0] == exception


def test_a_chained_traceback_gives_the_last_exception() -> None:
    output = (
        TRACEBACK
        + "KeyError: 'a'\n\nDuring handling of the above exception, another exception occurred:\n\n"
        + 'Traceback (most recent call last):\n  File "b.py", line 3, in g\n    h()\n'
        + "ValueError: b\n"
    )
    assert lines_of(output)[:2] == ["ValueError: b", 'File "b.py", line 3, in g']


def test_a_syntax_error_traceback() -> None:
    output = (
        'Traceback (most recent call last):\n  File "<string>", line 1\n    def (\n'
        "        ^\nSyntaxError: invalid syntax\n"
    )
    assert lines_of(output) == ["SyntaxError: invalid syntax", 'File "<string>", line 1']


PYTEST_FAILURE = """\
============================= test session starts ==============================
collected 3 items

tests/test_x.py .F.                                                      [100%]

=================================== FAILURES ===================================
________________________________ test_y ________________________________________

    def test_y():
>       assert parse("") == 1
E       AssertionError: assert 0 == 1

tests/test_x.py:12: AssertionError
=========================== short test summary info ============================
FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1
========================= 1 failed, 2 passed in 0.05s ==========================
"""


def test_pytest_failure_lines_even_when_piped_through_tail() -> None:
    output = rc(0, PYTEST_FAILURE)  # ``pytest ... | tail -50`` exits 0
    result = outcome(output, command="pytest tests -x 2>&1 | tail -50")
    assert result.failed
    assert [line.text for line in result.lines] == [
        "FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1",
        "E       AssertionError: assert 0 == 1",
        "========================= 1 failed, 2 passed in 0.05s ==========================",
        "tests/test_x.py:12: AssertionError",
    ]


@pytest.mark.parametrize(
    ("output", "first"),
    [
        # pytest
        ("ERROR tests/test_x.py - ModuleNotFoundError: No module named 'pytz'", None),
        ("ERROR tests/test_x.py::test_z - RuntimeError: boom", None),
        ("tests/test_x.py::test_y FAILED                                 [ 50%]", None),
        ("======= 2 failed, 1 error in 0.1s =======", None),
        ("=============== 1 error in 0.20s ===============", None),
        ("ERROR: file or directory not found: tests/nope.py", None),
        ("collecting ... ERROR: not found: /t/test_a.py::test_b", None),
        # unittest
        (
            "FAIL: test_add (tests.test_math.TestMath.test_add)\n---\nFAILED (failures=1)",
            "FAIL: test_add (tests.test_math.TestMath.test_add)",
        ),
        ("ERROR: test_load (tests.test_io.TestIO)", None),
        ("Ran 3 tests in 0.001s\n\nFAILED (errors=2)", "FAILED (errors=2)"),
        # jest, vitest
        ("  ✕ adds numbers (5 ms)", "✕ adds numbers (5 ms)"),
        ("FAIL src/sum.test.js\n  ● sum > adds", "FAIL src/sum.test.js"),
        ("Tests:       1 failed, 4 passed, 5 total", None),
        # Go
        ("--- FAIL: TestAdd (0.00s)\n    add_test.go:9: got 3\nFAIL", "--- FAIL: TestAdd (0.00s)"),
        ("ok  \texample.com/a\t0.01s\nFAIL\texample.com/m\t0.002s", "FAIL\texample.com/m\t0.002s"),
        ("panic: runtime error: index out of range [3] with length 3", None),
        # Rust
        ("error[E0308]: mismatched types\n --> src/main.rs:4:18", "error[E0308]: mismatched types"),
        (
            "thread 'main' panicked at src/main.rs:2:5:\nattempt to divide by zero",
            "thread 'main' panicked at src/main.rs:2:5:",
        ),
        ("test result: FAILED. 1 passed; 1 failed; 0 ignored", None),
        ('error: could not compile `demo` (bin "demo") due to 1 previous error', None),
        # Java, JavaScript
        (
            'Exception in thread "main" java.lang.NullPointerException\n\tat Foo.main(Foo.java:3)',
            'Exception in thread "main" java.lang.NullPointerException',
        ),
        # npm, compilers, type checkers, git
        ("npm ERR! code ELIFECYCLE\nnpm ERR! errno 1", "npm ERR! errno 1"),
        ("src/a.c:3:5: error: expected ';' before 'return'", None),
        ("app/x.py:12: error: Incompatible types in assignment  [assignment]", None),
        ("fatal: not a git repository (or any of the parent directories): .git", None),
        ("error: pathspec 'nope' did not match any file(s) known to git", None),
        # Patches that did not apply
        (
            "error: patch failed: src/a.py:12\nerror: src/a.py: patch does not apply",
            "error: src/a.py: patch does not apply",
        ),
        (
            "Hunk #1 FAILED at 12.\n1 out of 1 hunk FAILED -- saving rejects",
            "Hunk #1 FAILED at 12.",
        ),
        ("Invalid patch: the hunk header is malformed", None),
        ("patch: **** malformed patch at line 7: @@", None),
        ("can't find file to patch at input line 3", None),
        # Missing files and commands, permissions
        ("bash: line 1: pytset: command not found", None),
        ("cat: src/nope.py: No such file or directory", None),
        ("ls: cannot access 'build': No such file or directory", None),
        ("bash: ./run.sh: Permission denied", None),
        ("python: can't open file '/r/x.py': [Errno 2] No such file or directory", None),
    ],
)
def test_telling_error_lines_fail_an_output_whatever_its_exit_code(
    output: str, first: str | None
) -> None:
    for reported in (output, rc(0, output + "\n"), "exit code 0\n" + output):
        result = outcome(reported)
        assert result.failed, reported
        assert result.lines[0].text == (first if first is not None else output), reported


@pytest.mark.parametrize(
    ("output", "first"),
    [
        ("KeyError: 'x'", "KeyError: 'x'"),
        ("AssertionError", "AssertionError"),
        ("java.lang.NullPointerException", "java.lang.NullPointerException"),
        ("TypeError: Cannot read properties of undefined (reading 'x')", None),
        ("Uncaught ReferenceError: x is not defined", None),
        ("django.core.exceptions.ImproperlyConfigured: settings are not configured", None),
        ("Caused by: java.io.IOException: disk full", None),
        ("app/x.py:1:8: F401 [*] `os` imported but unused\nFound 1 error.", None),
    ],
)
def test_weaker_lines_count_in_a_failed_output_only(output: str, first: str | None) -> None:
    assert lines_of(rc(1, output + "\n"))[0] == (first or output.split("\n")[0])
    assert not outcome(rc(0, output + "\n")).failed  # printed by a script that went well


@pytest.mark.parametrize(
    "output",
    [
        # Source code and documentation are not errors.
        "    raise ValueError('bad input')\n    except KeyError:\n        pass",
        "class ImproperlyConfigured(Exception):\n    pass",
        "Raises\n------\nTypeError\n    If the input is not a string.",
        "    12\tFAILED = 'failed'\n    13\tERROR_CODES = {}",
        "src/app.py:12:    error: str = ''",
        "The patch applies cleanly.\nNo errors found.",
        "Found 0 errors in 3 files",
        "All checks passed!",
        "3 passed in 0.01s",
        "✗ a check an ad-hoc script printed",
        "docs/errors.md\nerror_handler.py",
        "Error handling is described in docs/errors.md",
    ],
)
def test_near_misses_are_not_failures(output: str) -> None:
    assert not outcome(rc(0, output + "\n")).failed, output
    assert not outcome(output).failed, output


@pytest.mark.parametrize(
    "output",
    [
        "Error: old_str not found in src/a.py",
        "error: the file does not exist",
        "ERROR:\nInvalid `path` parameter: /x is not an absolute path",
        "Error - connection refused",
    ],
)
def test_a_tool_output_starting_with_error_is_a_failure(output: str) -> None:
    result = outcome(output)
    assert result.failed
    assert result.lines[0].text == output.split("\n")[0]


def test_a_tool_error_entry_is_told_by_its_first_line() -> None:
    result = outcome("\n<output>\npermission denied for user bob\nmore", is_error=True)
    assert result.failed
    assert [line.text for line in result.lines] == ["permission denied for user bob"]
    assert outcome("", is_error=True).failed


# Rule 5: what a program the agent ran prints when something went wrong (exit 0).
PRINTED = [
    # A caught exception printed by a reproduction script.
    ("python repro.py", "Created\nTypeError: object of type 'PersonName' has no len()\nDone"),
    ("python repro.py", "Trying equal bounds...\nError: ('Iterations exceeded maximum', ' NaN')"),
    ("python -c 'import x; x.f()'", "  Error: TypeError: object of type 'map' has no len()"),
    ("cd /r && python t.py", "UnicodeEncodeError: 'charmap' codec can't encode character"),
    ("python t.py", "marshmallow.exceptions.ValidationError: {'bar': ['Not a valid mapping.']}"),
    ("node t.js", "Error: Cannot find module './x'"),
    # A traceback whose header ``| tail`` cut off.
    (
        "cd /r && python -m pytest t.py -xvs 2>&1 | tail -4",
        '  File "/r/_pytest/config/__init__.py", line 1814, in _getini_toml\n'
        "    raise TypeError(\n"
        "TypeError: /r/pyproject.toml: config option 'testpaths' expects a list",
    ),
    # An exception ``| grep`` picked out of the output.
    (
        "python -c 'from t import *; test_rules()' 2>&1 | grep -i 'ERROR' | head -20",
        "NameError: name 'test_rules' is not defined. Did you mean: 'get_ruleset'?",
    ),
    # Code written, then run, in one command.
    ("cat > t.py << 'EOF'\nprint(1)\nEOF\npython t.py", "Error: Dropped elements in sequence"),
]


@pytest.mark.parametrize(("command", "output"), PRINTED)
def test_an_error_a_program_prints_fails_its_output_whatever_its_exit_code(
    command: str, output: str
) -> None:
    # The line printed: the last that opens (indented or not) with an error's name.
    printed = [ln.strip() for ln in output.splitlines() if re.match(r"\s*[\w.]*(?:Error|n):", ln)]
    assert printed
    for reported in (rc(0, output + "\n"), output, "exit code 0\n" + output):
        result = outcome(reported, command=command)
        assert result.failed, reported
        assert printed[-1] in [line.text for line in result.lines], reported
    # The same text read from a file is not a failure; nor is it without a command.
    for look_up in ("cat repro.log", "grep -rn Error . | head", "sed -n '1,20p' t.py", "ls"):
        assert not outcome(rc(0, output + "\n"), command=look_up).failed, look_up
    assert not outcome(rc(0, output + "\n")).failed


@pytest.mark.parametrize(
    "output",
    [
        # Indented exception names: a docstring's Raises section, help() output.
        "Help on function f:\n    Raises:\n        ValueError: if x is negative",
        "    TypeError: if the input is not a string.",
        # An error that is a figure, or no error at all.
        "Error: 0.00123",
        "Relative Error: 1.5e-07",
        "Error: 3%",
        "Error: None",
        "  Error: 0",
        "Error:",
        # Not at the start of a line, or not an error's name.
        "Expected TypeError: raised as it should be",
        "print('Error: x')  # in the code shown",
        "ErrorHandler: registered",
        "Errors: 0",
        "errors.py: 3 functions",
    ],
)
def test_printed_near_misses_are_not_failures(output: str) -> None:
    assert not outcome(rc(0, output + "\n"), command="python t.py").failed, output


def test_a_printed_error_is_resolved_when_the_script_runs_clean() -> None:
    printed = rc(0, "Testing...\nError: argument of type 'PersonName' is not iterable\n")
    entries = run(("python repro.py", printed), ("sed -i 's/a/b/' src/a.py", OK))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line == "Error: argument of type 'PersonName' is not iterable"
    assert anchor.label == "python repro.py"
    entries = run(("python repro.py", printed), ("python repro.py", rc(0, "Testing...\nok\n")))
    assert latest_unresolved_error(entries) is None


def test_a_failed_result_of_tags_only_is_told_by_its_tag() -> None:
    assert lines_of("<A>", is_error=True) == ["<A>"]
    assert lines_of("\n  <error/>\n<b>\n", is_error=True) == ["<error/>"]
    assert lines_of("<output>\n<b>\n</output>\nexit code 1") == ["exit code 1"]


def test_only_the_end_of_a_long_output_is_searched() -> None:
    early = "FAILED tests/a.py::test_old - AssertionError\n"
    assert not outcome(early + "x" * (anchors.SCAN_CHARS + 10)).failed
    assert outcome("x" * (anchors.SCAN_CHARS + 10) + "\n" + early).failed


@PROPERTY
@given(st.text(max_size=300), st.booleans(), st.sampled_from([None, "grep x a", "python x.py"]))
def test_any_output_is_survived_and_a_failure_always_says_something(
    output: str, is_error: bool, command: str | None
) -> None:
    result = outcome(output, is_error=is_error, command=command)
    if is_error:
        assert result.failed
    for line in result.lines:
        assert "\n" not in line.text
        assert line.text == line.text.strip()
        assert line.text in output or line.text.replace("\t", " ") in output
    if result.failed and output.strip() and any(c.isalnum() for c in output):
        assert result.lines


@PROPERTY
@given(
    st.lists(st.sampled_from(["ok", "Error", "FAIL", "x.py:1: error: y", "\n", " "]), max_size=40)
)
def test_error_lines_are_unique_and_at_most_four(parts: list[str]) -> None:
    output = "\n".join(parts)
    lines = lines_of(output, is_error=True)
    assert len(lines) == len(set(lines)) <= anchors.MAX_LINES


# --- Unresolved ------------------------------------------------------------------------

FAIL = rc(1, TRACEBACK + "KeyError: 'x'\n")
OK = rc(0, "done\n")


def test_the_latest_unresolved_error_says_what_where_and_from_which_command() -> None:
    entries = run(("ls", OK), ("cd /r && python repro.py 2>&1 | tail -5", FAIL), ("ls src", OK))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line == "KeyError: 'x'"
    assert anchor.lines[1] == 'File "/testbed/app/settings.py", line 8, in main'
    assert anchor.command == "cd /r && python repro.py 2>&1 | tail -5"
    assert anchor.label == "cd /r && python repro.py 2>&1 | tail -5"
    assert anchor.index == 4
    assert entries[anchor.index].tool_call_id == anchor.tool_call_id == "c1"
    assert anchor.tool == "bash"
    assert anchor.exit_code == 1


@pytest.mark.parametrize(
    ("later", "resolved"),
    [
        # The same command, filters and redirections aside.
        ("python repro.py", True),
        ("python repro.py 2>&1 | tail -20", True),
        ("python repro.py > out.txt", True),
        # The same script, wherever it was run from.
        ("cd /testbed && python3 repro.py", True),
        ("python /testbed/repro.py", True),
        # Not the same check.
        ("python other.py", False),
        ("python -c 'import repro'", False),
        ("pytest tests/test_repro.py", False),
        ("sed -i 's/a/b/' repro.py", False),
    ],
)
def test_a_failure_is_resolved_by_the_same_command_or_script_going_well(
    later: str, resolved: bool
) -> None:
    entries = run(("python repro.py", FAIL), ("sed -i 's/a/b/' src/a.py", OK), (later, OK))
    anchor = latest_unresolved_error(entries)
    assert (anchor is None) == resolved, anchor
    # A later run that fails again is the latest failure.
    entries = run(("python repro.py", FAIL), (later, FAIL))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.index == 4


TEST_FAIL = rc(0, PYTEST_FAILURE)
TEST_OK = rc(0, "=============== 3 passed in 0.02s ===============\n")


@pytest.mark.parametrize(
    ("failed", "later", "resolved"),
    [
        ("pytest tests/test_x.py::test_y -x", "pytest tests/test_x.py::test_y", True),
        ("pytest tests/test_x.py::test_y", "pytest tests/test_x.py", True),
        ("pytest tests/test_x.py::test_y", "python -m pytest tests/", True),
        ("pytest tests/test_x.py::test_y", "python -m pytest -q", True),  # the whole suite
        ("cd /r && python -m pytest tests/test_x.py -xvs 2>&1 | tail -50", "pytest tests", True),
        ("pytest tests/test_x.py::test_y", "pytest tests/test_z.py", False),
        ("pytest tests/test_x.py::test_y", "pytest tests/test_x.py::test_other", False),
        ("pytest tests/test_x.py", "pytest tests/test_x.py::test_y", False),
        ("pytest tests/test_x.py", "pytest -k parse", False),  # narrowed
        ("pytest -k parse tests", "pytest tests -k parse", True),
        ("pytest tests/test_x.py", "mypy tests/test_x.py", False),
        ("python -m unittest tests.test_x.T.test_y", "python -m unittest tests.test_x", True),
        ("python -m unittest tests.test_x", "python -m unittest discover", True),
        ("mypy app/x.py", "mypy app", True),
        ("ruff check app/x.py", "ruff check .", True),
        ("go test ./pkg/a", "go test ./...", True),
        ("npx jest src/sum.test.js", "npx jest", True),
    ],
)
def test_a_test_failure_is_resolved_by_a_later_run_that_covers_it(
    failed: str, later: str, resolved: bool
) -> None:
    entries = run((failed, TEST_FAIL), (later, TEST_OK))
    assert (latest_unresolved_error(entries) is None) == resolved


def test_a_run_that_ran_no_tests_resolves_nothing() -> None:
    nothing = rc(0, "collected 0 items\n\n========== no tests ran in 0.01s ==========\n")
    entries = run(("pytest tests/test_x.py", TEST_FAIL), ("pytest tests/test_x.py", nothing))
    assert latest_unresolved_error(entries) is not None


def test_a_failed_look_up_is_resolved_by_any_later_success() -> None:
    missing = rc(2, "ls: cannot access 'build': No such file or directory\n")
    entries = run(("ls build", missing), ("ls", OK))
    assert latest_unresolved_error(entries) is None
    entries = run(("cat src/nope.py | head", rc(1, "cat: src/nope.py: No such file\n")))
    assert latest_unresolved_error(entries) is not None  # nothing went well after it
    # A command that changes things is not a look-up.
    entries = run(("cat > a.py << 'EOF'\nx\nEOF\npython a.py", FAIL), ("ls", OK))
    assert latest_unresolved_error(entries) is not None


def test_an_older_failure_stays_the_latest_unresolved_when_a_newer_one_is_resolved() -> None:
    entries = run(
        ("pytest tests/test_x.py", TEST_FAIL),
        ("python repro.py", FAIL),
        ("python repro.py", OK),
    )
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line.startswith("FAILED tests/test_x.py::test_y")
    assert [a.line for a in failures(entries)] == [
        "KeyError: 'x'",
        "FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1",
    ]
    assert len(failures(entries, limit=1)) == 1


def test_a_heredoc_then_a_run_is_labelled_by_the_run() -> None:
    command = "cat > repro.py << 'EOF'\nimport x\nprint(x.y)\nEOF\npython repro.py"
    anchor = latest_unresolved_error(run((command, FAIL)))
    assert anchor is not None
    assert anchor.label == "python repro.py"
    assert anchor.command == command
    assert latest_unresolved_error(run((command, FAIL), ("python repro.py", OK))) is None


def test_tool_errors_are_resolved_by_the_same_tool_on_the_same_file() -> None:
    editor = "str_replace_based_edit_tool"
    edit = {"command": "str_replace", "path": "/r/a.py", "old_str": "x", "new_str": "y"}
    entries: list[Entry] = [
        tool_call("e1", editor, edit),
        result("e1", "No replacement was performed: old_str did not appear", is_error=True),
        tool_call("e2", editor, {**edit, "path": "/r/b.py"}),
        result("e2", "The file /r/b.py has been edited."),
    ]
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line == "No replacement was performed: old_str did not appear"
    assert anchor.tool == editor
    assert anchor.command is not None
    assert editor in anchor.command
    entries += [
        tool_call("e3", editor, {**edit, "old_str": "z"}),
        result("e3", "The file /r/a.py has been edited."),
    ]
    assert latest_unresolved_error(entries) is None


def test_a_tool_result_without_its_call_still_counts() -> None:
    entries = [result("lost", "Error: something broke")]
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.command is None
    assert anchor.line == "Error: something broke"


def test_is_resolved_judges_an_earlier_command_by_the_later_history() -> None:
    later = run(("sed -i 's/a/b/' x.py", OK), ("python repro.py | tail", OK))
    assert is_resolved("python repro.py", later)
    assert not is_resolved("python other.py", later)
    assert is_resolved("pytest tests/test_x.py::test_y", run(("pytest tests", TEST_OK)))
    assert not is_resolved("pytest tests/test_x.py::test_y", run(("pytest tests", TEST_FAIL)))


def test_no_failure_no_anchor() -> None:
    assert latest_unresolved_error([]) is None
    assert latest_unresolved_error(run(("ls", OK), ("grep -n x a.py", rc(1)))) is None
    assert failures(run(("ls", OK))) == []


def test_the_cache_gives_the_same_answers() -> None:
    entries = run(("python repro.py", FAIL), ("ls", OK), ("pytest tests/test_x.py", TEST_FAIL))
    cache: anchors.Outcomes = {}
    first = latest_unresolved_error(entries, cache)
    assert cache
    assert latest_unresolved_error(entries, cache) == first
    assert latest_unresolved_error(entries) == first


STEPS = st.sampled_from(
    [
        ("python repro.py", FAIL),
        ("python repro.py", OK),
        ("pytest tests/test_x.py", TEST_FAIL),
        ("pytest tests", TEST_OK),
        ("ls build", rc(2, "ls: cannot access 'build': No such file or directory\n")),
        ("ls", OK),
        ("grep -n x a.py", rc(1)),
        ("sed -i 's/a/b/' a.py", OK),
    ]
)


@PROPERTY
@given(st.lists(STEPS, max_size=12))
def test_the_latest_unresolved_error_is_a_failure_and_nothing_after_it_resolves_it(
    steps: list[tuple[str, str]],
) -> None:
    entries = run(*steps)
    anchor = latest_unresolved_error(entries)
    found = failures(entries)
    if anchor is None:
        assert all(is_resolved(f.command or "", entries[f.index + 1 :]) for f in found)
        return
    assert anchor in found
    assert anchor.command is not None
    assert not is_resolved(anchor.command, entries[anchor.index + 1 :])
    # Every newer failure is resolved.
    for newer in found[: found.index(anchor)]:
        assert is_resolved(newer.command or "", entries[newer.index + 1 :])


# --- The real traces -------------------------------------------------------------------


def trace_entries(path: Path) -> list[Entry]:
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(load(path))]


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_every_traceback_gives_its_exception(path: Path) -> None:
    """By a rule of its own: a result whose output ends a traceback with a line
    ``Name: message`` at the start of a line is a failure whose lines hold it."""
    entries = trace_entries(path)
    closing = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)(?::.*)?)$", re.M)
    checked = 0
    for entry in entries:
        output = entry.text()
        if entry.role != "tool" or "Traceback (most recent call last)" not in output:
            continue
        tail = output[output.rfind("Traceback (most recent call last)") :]
        exception = closing.search(tail)
        if exception is None or len(output) > anchors.SCAN_CHARS:
            continue
        result = outcome(output)
        assert result.failed
        assert exception[1].strip() in [line.text for line in result.lines], output[-800:]
        checked += 1
    assert checked or path.name.startswith("sqlfluff__sqlfluff-2419")  # it has none


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_failures_are_failed_results(path: Path) -> None:
    entries = trace_entries(path)
    found = failures(entries)
    assert found, "every session fails at least once"
    for anchor in found:
        entry = entries[anchor.index]
        assert entry.role == "tool"
        assert entry.tool_call_id == anchor.tool_call_id
        assert anchor.line
        assert anchor.line in entry.text()
        assert anchor.command is not None
    latest = latest_unresolved_error(entries)
    if latest is not None:
        assert latest in found
        assert not is_resolved(latest.command or "", entries[latest.index + 1 :])


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_a_non_zero_return_code_is_a_failure_but_nothing_found(path: Path) -> None:
    entries = trace_entries(path)
    failed = {a.index for a in failures(entries)}
    calls = {
        p["id"]: anchors.command_of(p) or ""
        for e in entries
        if e.role == "assistant"
        for p in e.tool_calls()
    }
    for k, entry in enumerate(entries):
        m = re.match(
            r"<returncode>(-?\d+)</returncode>\n<output>\n(.*)</output>", entry.text(), re.S
        )
        if entry.role != "tool" or m is None or m[1] == "0":
            continue
        command = calls[entry.tool_call_id or ""]
        quiet = m[1] == "1" and not m[2].strip() and "grep" in command
        assert (k in failed) == (not quiet), (command, entry.text()[-300:])


# --- Task terms ------------------------------------------------------------------------


def test_task_terms_of_a_request() -> None:
    request = (
        "[version 2.20.0] TypeError: 'NoneType' object is not subscriptable\n"
        "After the update, `Schema.validate` fails in src/marshmallow/schema.py with "
        "django.core.exceptions.ImproperlyConfigured; see tests/test_x.py::test_y and "
        'getValue(), use --dry-run, within 100ms, issue #1234, python3.7, the "quoted string", '
        "https://example.com/a/b. It's the user's config (e.g. .gitignore), MAX_SIZE=10."
    )
    assert task_terms(request) == [
        "2.20.0",
        "TypeError",
        "NoneType",
        "Schema.validate",
        "src/marshmallow/schema.py",
        "django.core.exceptions.ImproperlyConfigured",
        "tests/test_x.py::test_y",
        "getValue",
        "--dry-run",
        "100ms",
        "#1234",
        "python3.7",
        "quoted string",
        "https://example.com/a/b",
        ".gitignore",
        "MAX_SIZE",
    ]


@pytest.mark.parametrize(
    "request_text",
    [
        "Please fix the bug. It is urgent and it's important, e.g. for users.",
        "Use JSON, not XML. Check the API and the URLs and IDs.",
        "Run it 3 times and 2.5 percent more, in 2024, at 10:30",
        "",
    ],
)
def test_plain_words_are_not_terms(request_text: str) -> None:
    assert task_terms(request_text) == []


@PROPERTY
@given(st.text(max_size=300))
def test_task_terms_are_in_the_text_once_in_order(request_text: str) -> None:
    terms = task_terms(request_text)
    assert len(terms) == len(set(terms))
    positions = [request_text.find(t) for t in terms]
    assert all(p >= 0 for p in positions)
    assert all(t.strip() == t and t for t in terms)


# --- Clipping a request ------------------------------------------------------------------

OMITTED = re.compile(r"^\[\.\.\. (\d+) lines omitted \.\.\.\]$")


def check_clip(original: str, clipped: str, max_chars: int) -> list[str]:
    """The kept lines, after checking the clip's invariants."""
    assert len(clipped) <= max_chars
    if len(original) <= max_chars:
        assert clipped == original
        return original.split("\n")
    lines = original.split("\n")
    out = clipped.split("\n")
    if not any(OMITTED.match(line) for line in out):  # the head cut to size
        assert clipped.endswith("…") or not clipped
        assert original.startswith(clipped.removesuffix("…"))
        return []
    kept: list[str] = []
    k = 0
    for line in out:
        m = OMITTED.match(line)
        if m is not None and not (k < len(lines) and lines[k] == line):
            assert int(m[1]) > 0
            k += int(m[1])
            continue
        assert lines[k] == line
        kept.append(line)
        k += 1
    assert k == len(lines)
    return kept


def test_clipping_keeps_the_opening_the_errors_and_the_terms() -> None:
    filler = [f"Some background sentence number {n} about nothing at all." for n in range(80)]
    request = "\n".join(
        [
            "Fix the crash when parsing an empty header.",
            *filler[:30],
            "Traceback (most recent call last):",
            '  File "app/parser.py", line 12, in parse_header',
            "IndexError: string index out of range",
            *filler[30:60],
            "The fix belongs in `parse_header` in app/parser.py.",
            *filler[60:],
            "Thanks!",
        ]
    )
    clipped = clip_keeping_anchors(request, 600)
    kept = check_clip(request, clipped, 600)
    assert kept[0] == "Fix the crash when parsing an empty header."
    assert "IndexError: string index out of range" in kept
    assert "The fix belongs in `parse_header` in app/parser.py." in kept
    assert '  File "app/parser.py", line 12, in parse_header' in kept
    assert "[... 30 lines omitted ...]" in clipped
    # Every term of the request that fits is still there.
    assert {"IndexError", "parse_header", "app/parser.py"} <= set(task_terms(clipped))


def test_clipping_without_anchors_keeps_the_head_and_the_tail() -> None:
    request = "\n".join(f"line {n}" for n in range(100))
    clipped = clip_keeping_anchors(request, 120)
    kept = check_clip(request, clipped, 120)
    assert kept[:2] == ["line 0", "line 99"] or kept[0] == "line 0"
    assert "line 99" in kept
    assert "line 1" in kept
    assert "line 50" not in kept


def test_a_text_that_fits_is_unchanged_and_a_single_long_line_is_cut() -> None:
    assert clip_keeping_anchors("short\ntext", 100) == "short\ntext"
    clipped = clip_keeping_anchors("x" * 500, 100)
    assert clipped == "x" * 99 + "…"
    assert clip_keeping_anchors("abc", 0) == ""


LINES = st.lists(
    st.sampled_from(
        [
            "",
            "plain words here",
            "KeyError: 'x'",
            "see src/a.py",
            "`parse_header` fails",
            "x" * 90,
            "Traceback (most recent call last):",
            "FAILED tests/t.py::test_a - AssertionError",
        ]
    )
    | st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=40),
    max_size=40,
)


@PROPERTY
@given(LINES, st.integers(min_value=0, max_value=700))
def test_clipping_keeps_whole_lines_in_order_within_the_size(
    lines: list[str], max_chars: int
) -> None:
    original = "\n".join(lines)
    check_clip(original, clip_keeping_anchors(original, max_chars), max_chars)


@PROPERTY
@given(LINES, st.integers(min_value=200, max_value=700))
def test_clipping_keeps_the_error_lines_that_fit_first(lines: list[str], max_chars: int) -> None:
    original = "\n".join(lines)
    clipped = clip_keeping_anchors(original, max_chars)
    errors = [ln for ln in lines if ln.startswith(("KeyError", "FAILED"))]
    opening = next((ln for ln in lines if ln.strip()), "")  # kept first
    marker = len("[... 99 lines omitted ...]\n")  # at most one either side of a line
    # Every occurrence costs its characters: a repeated error line is kept each time.
    if sum(len(e) + 1 + 2 * marker for e in [opening, *errors]) < max_chars:
        kept = set(clipped.split("\n"))
        assert set(errors) <= kept


def test_clipping_prefers_lines_that_add_the_most_terms_per_character() -> None:
    # Long code lines early in a request, each naming one new identifier, used to take
    # the budget line by line before the short lines at its end that name what the task
    # is about.
    code = [
        f"    value_{n} = compute_total(report_items, scale=scale_factor) + offset * 2"
        for n in range(8)
    ]
    request = "\n".join(
        [
            "Fix the totals report.",
            *code,
            "Run `make check` before you submit.",
            "Put the patch in patch.txt with git diff -- app/report.py.",
        ]
    )
    clipped = clip_keeping_anchors(request, 260)
    kept = check_clip(request, clipped, 260)
    assert "Run `make check` before you submit." in kept
    assert "Put the patch in patch.txt with git diff -- app/report.py." in kept
    assert {"make check", "patch.txt", "app/report.py"} <= set(task_terms(clipped))


def test_a_huge_text_is_read_only_at_its_head_and_tail() -> None:
    middle = [f"debug line {n} of a pasted log in module_{n}.py" for n in range(60_000)]
    request = "\n".join(
        ["Why does the import fail?", *middle, "ImportError: cannot import name 'x'"]
    )
    clipped = clip_keeping_anchors(request, 2_000)
    kept = check_clip(request, clipped, 2_000)
    assert kept[0] == "Why does the import fail?"
    assert "ImportError: cannot import name 'x'" in kept
    # The lines between the read head and tail are never kept.
    assert "debug line 30000 of a pasted log in module_30000.py" not in kept


# --- The latest error, of any shape --------------------------------------------------------
# Outputs as mini-swe-agent writes them (tests/data/traces): a ``<returncode>`` and the
# command's standard output and error merged in an ``<output>`` block.

SCRIPT_RUN = rc(
    1,
    "Traceback (most recent call last):\n"
    '  File "/testbed/analyze_fix.py", line 14, in <module>\n'
    "    print(foo)\n"
    "          ^^^\n"
    "NameError: name 'foo' is not defined\n"
    # The script's own output, buffered on a pipe, is flushed after the traceback.
    "Case 1: ok\n"
    "ERROR: case 2 gave 3, expected 4\n",
)


def test_a_failed_script_run_gives_its_traceback_last_line_before_what_it_printed() -> None:
    anchor = latest_unresolved_error(run(("python analyze_fix.py", SCRIPT_RUN)))
    assert anchor is not None
    assert anchor.line == "NameError: name 'foo' is not defined"
    assert anchor.lines[1] == 'File "/testbed/analyze_fix.py", line 14, in <module>'
    # The line the output ended on is quoted with it.
    assert anchor.also == ("ERROR: case 2 gave 3, expected 4",)
    assert anchor.label == "python analyze_fix.py"


FRAMEWORK_FRAMES = (
    '  File "/testbed/django/test/utils.py", line 125, in setup_test_environment\n'
    "    settings.DEBUG = debug\n"
    '  File "/testbed/django/conf/__init__.py", line 57, in _setup\n'
    "    raise ImproperlyConfigured(\n"
)
FRAMEWORK_EXCEPTION = (
    "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG, but settings are"
    " not configured. You must either define the environment variable"
    " DJANGO_SETTINGS_MODULE or call settings.configure() before accessing settings."
)


@pytest.mark.parametrize(
    "output",
    [
        # ``| tail -300`` kept the whole traceback; the status is tail's.
        rc(
            0,
            "Traceback (most recent call last):\n" + FRAMEWORK_FRAMES + FRAMEWORK_EXCEPTION + "\n",
        ),
        # ``| tail -20`` cut its header off.
        rc(0, FRAMEWORK_FRAMES + FRAMEWORK_EXCEPTION + "\n"),
    ],
)
def test_a_framework_exception_read_through_a_pipe_is_the_latest_error(output: str) -> None:
    command = "cd /testbed && python manage.py test 2>&1 | tail -300"
    entries = run(("ls", OK), (command, output), ("cat setup.cfg", OK))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.exit_code == 0
    assert anchor.line == FRAMEWORK_EXCEPTION
    assert anchor.also == ()
    assert anchor.label == command


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (
            "bash: -c: line 1: syntax error near unexpected token `('\n"
            "bash: -c: line 1: `python -c print(len(x))'\n",
            "bash: -c: line 1: syntax error near unexpected token `('",
        ),
        ('/bin/sh: 1: Syntax error: "(" unexpected\n', '/bin/sh: 1: Syntax error: "(" unexpected'),
        (
            "bash: -c: line 1: unexpected EOF while looking for matching `''\n"
            "bash: -c: line 2: syntax error: unexpected end of file\n",
            "bash: -c: line 2: syntax error: unexpected end of file",
        ),
    ],
)
def test_a_shell_syntax_error_is_the_error_not_the_line_it_echoes(output: str, line: str) -> None:
    command = "python -c print(len(x))"
    assert lines_of(rc(2, output), command=command)[0] == line
    anchor = latest_unresolved_error(run((command, rc(2, output))))
    assert anchor is not None
    assert (anchor.line, anchor.exit_code) == (line, 2)
    # Quoted in a file it is not a failure (its row needs the shell's name first).
    assert not outcome(rc(0, "# " + line + "\n"), command="cat notes.md").failed


UNITTEST_ERROR = """\
.E.
======================================================================
ERROR: test_parse (__main__.TestParse.test_parse)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/test_x.py", line 9, in test_parse
    self.assertEqual(parse("a"), 1)
TypeError: parse() missing 1 required positional argument: 'b'

----------------------------------------------------------------------
Ran 3 tests in 0.001s

FAILED (errors=1)
"""
UNITTEST_FAILURES = """\
F.FE
======================================================================
ERROR: test_c (__main__.T.test_c)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/test_x.py", line 14, in test_c
    x()
NameError: name 'x' is not defined

======================================================================
FAIL: test_a (__main__.T.test_a)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/test_x.py", line 7, in test_a
    self.assertEqual(1, 2)
AssertionError: 1 != 2

======================================================================
FAIL: test_b (__main__.T.test_b)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/test_x.py", line 10, in test_b
    self.assertTrue(False)
AssertionError: False is not true

----------------------------------------------------------------------
Ran 4 tests in 0.002s

FAILED (failures=2, errors=1)
"""
HEREDOC_RUN = (
    "cat <<'EOF' > test_x.py && python test_x.py\n"
    "import unittest\n\nfrom parser import parse\n\n\n"
    "class TestParse(unittest.TestCase):\n"
    "    def test_parse(self):\n"
    '        self.assertEqual(parse("a"), 1)\n\n\n'
    "if __name__ == '__main__':\n    unittest.main()\nEOF"
)


@pytest.mark.parametrize(
    ("output", "line", "summary"),
    [
        (UNITTEST_ERROR, "ERROR: test_parse (__main__.TestParse.test_parse)", "FAILED (errors=1)"),
        (UNITTEST_FAILURES, "FAIL: test_b (__main__.T.test_b)", "FAILED (failures=2, errors=1)"),
    ],
)
def test_a_unittest_summary_of_a_heredoc_script_is_kept_with_its_failure(
    output: str, line: str, summary: str
) -> None:
    entries = run((HEREDOC_RUN, rc(1, output)))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line == line
    # The summary the run ended on goes with it (of the second, past the four lines kept).
    assert anchor.also == (summary,)
    assert anchor.label == "cat <<'EOF' > test_x.py && python test_x.py"
    # Piped through tail the status is 0: the summary alone tells the failure.
    assert outcome(rc(0, summary + "\n"), command="python test_x.py | tail -3").failed
    # Rewritten and run clean, it is resolved.
    clean = rc(
        0,
        "...\n----------------------------------------------------------------------\n"
        "Ran 3 tests in 0.001s\n\nOK\n",
    )
    assert latest_unresolved_error(run((HEREDOC_RUN, rc(1, output)), (HEREDOC_RUN, clean))) is None


def syntax_error(line: int, code: str, message: str) -> str:
    return rc(1, f'  File "/testbed/repro.py", line {line}\n    {code}\n        ^\n{message}\n')


def test_a_syntax_error_is_kept_with_where_it_is_the_latest_run_not_an_older_one() -> None:
    older = syntax_error(9, 'print("x"', "SyntaxError: '(' was never closed")
    newer = syntax_error(12, "def f(:", "SyntaxError: invalid syntax")
    edit = ("sed -i '9s/$/)/' repro.py", rc(0))
    entries = run(("python repro.py", older), edit, ("python repro.py", newer))
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    assert anchor.line == "SyntaxError: invalid syntax"
    assert anchor.lines[1] == 'File "/testbed/repro.py", line 12'
    assert anchor.also == ('File "/testbed/repro.py", line 12',)
    # The older run's error is no longer an unresolved one: the same check failed since.
    assert [a.line for a in anchors.unresolved_errors(entries, 2)] == [anchor.line]
    assert anchors.is_superseded("python repro.py", entries[5:])
    assert not anchors.is_resolved("python repro.py", entries[5:])
    assert not anchors.is_superseded("python other.py", entries[5:])
    # The same message twice: where it is tells them apart.
    again = syntax_error(12, "def f(:", "SyntaxError: invalid syntax")
    first = syntax_error(9, "def g(:", "SyntaxError: invalid syntax")
    anchor = latest_unresolved_error(
        run(("python repro.py", first), edit, ("python repro.py", again))
    )
    assert anchor is not None
    assert anchor.also == ('File "/testbed/repro.py", line 12',)


def test_a_syntax_error_in_a_traceback_or_quoted_by_pytest_is_located() -> None:
    imported = rc(
        1,
        "Traceback (most recent call last):\n"
        '  File "/testbed/reproduce.py", line 1, in <module>\n'
        "    import repro\n"
        '  File "/testbed/repro.py", line 12\n'
        "    def f(:\n          ^\n"
        "SyntaxError: invalid syntax\n",
    )
    anchor = latest_unresolved_error(run(("python reproduce.py", imported)))
    assert anchor is not None
    assert anchor.also == ('File "/testbed/repro.py", line 12',)
    collected = rc(
        2,
        'E     File "/testbed/tests/test_repro.py", line 12\n'
        "E       def f(:\n"
        "E             ^\n"
        "E   SyntaxError: invalid syntax\n"
        "=========================== short test summary info ============================\n"
        "ERROR tests/test_repro.py\n"
        "=============================== 1 error in 0.12s ===============================\n",
    )
    anchor = latest_unresolved_error(run(("pytest tests/test_repro.py", collected)))
    assert anchor is not None
    assert anchor.line == "ERROR tests/test_repro.py"
    assert anchor.also == (
        "=============================== 1 error in 0.12s ===============================",
    )
    assert 'File "/testbed/tests/test_repro.py", line 12' not in anchor.also  # not its line
