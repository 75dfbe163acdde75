"""The extractive summary keeps the latest error of any shape (app/engine/compaction/extractive.py):
a script's traceback, a framework's exception read through a pipe, a shell's syntax error,
unittest's summary of a script written by a here-document, and a syntax error whose line
changed between two runs; judged by the continuity measure's own rules
(bench/continuity_rules.py), in a summary cut to a 16k window's size."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction.anchors import latest_unresolved_error
from app.engine.compaction.continuity import ERROR_KEY_CHARS
from app.engine.compaction.extractive import PINNED_LABEL, extractive_summary, parse_summary
from app.engine.model import Entry
from bench import continuity_rules as rules

# About what an extractive summary gets at a 16k window: Blocked keeps its pinned head
# and little else.
SMALL = 1_800


def text(s: str) -> dict[str, str]:
    return {"type": "text", "text": s}


def rc(code: int, output: str) -> str:
    """An output as mini-swe-agent writes it."""
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


def history(*steps: tuple[str, str]) -> list[Entry]:
    """A request, then each shell call with its output, each after a sentence of the agent."""
    entries = [Entry(role="user", parts=[text("Fix the parser in `src/parser.py`.")])]
    for k, (command, output) in enumerate(steps):
        arguments = json.dumps({"command": command})
        entries.append(
            Entry(
                role="assistant",
                parts=[
                    text(f"Step {k}: let me check what this gives."),
                    {"type": "tool_call", "id": f"c{k}", "name": "bash", "arguments": arguments},
                ],
            )
        )
        entries.append(Entry(role="tool", parts=[text(output)], tool_call_id=f"c{k}"))
    return entries


def noise(n: int) -> list[tuple[str, str]]:
    """Look-ups and failures the agent moved on from: they fill Blocked and Done."""
    out: list[tuple[str, str]] = []
    for k in range(n):
        out.append((f"sed -n '{k},{k + 30}p' src/module_{k}.py", rc(0, "x = 1\n" * 40)))
        out.append((f"python check_{k}.py", rc(1, f"KeyError: 'field_{k}_was_not_found_here'\n")))
        out.append((f"python check_{k}.py", rc(0, "ok\n")))
    return out


UNITTEST = """\
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

FAILED ({counts})
"""
HEREDOC = (
    "cat <<'EOF' > test_x.py && python test_x.py\nimport unittest\n\nfrom parser import parse\n\n"
    "class TestParse(unittest.TestCase):\n    def test_parse(self):\n"
    '        self.assertEqual(parse("a"), 1)\n\nunittest.main()\nEOF'
)
IMPROPERLY = (
    "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG, but settings are not"
    " configured. You must either define the environment variable DJANGO_SETTINGS_MODULE or"
    " call settings.configure() before accessing settings."
)
FRAMES = (
    '  File "/testbed/django/test/utils.py", line 125, in setup_test_environment\n'
    "    settings.DEBUG = debug\n"
    '  File "/testbed/django/conf/__init__.py", line 57, in _setup\n'
    "    raise ImproperlyConfigured(\n"
)


def syntax_error(line: int, message: str = "SyntaxError: invalid syntax") -> str:
    return rc(1, f'  File "/testbed/repro.py", line {line}\n    def f(:\n          ^\n{message}\n')


SHAPES = {
    "script traceback": (
        "python analyze_fix.py",
        rc(
            1,
            'Traceback (most recent call last):\n  File "/testbed/analyze_fix.py", line 14, in'
            " <module>\n    print(foo)\n          ^^^\nNameError: name 'foo' is not defined\n"
            "Case 1: ok\nERROR: case 2 gave 3, expected 4\n",
        ),
        "NameError: name 'foo' is not defined",
    ),
    "framework exception through a pipe": (
        "cd /testbed && python manage.py test 2>&1 | tail -300",
        rc(0, "Traceback (most recent call last):\n" + FRAMES + IMPROPERLY + "\n"),
        IMPROPERLY,
    ),
    "framework exception, header cut": (
        "cd /testbed && python manage.py test 2>&1 | tail -20",
        rc(0, FRAMES + IMPROPERLY + "\n"),
        IMPROPERLY,
    ),
    "shell syntax error": (
        "python -c print(len(x))",
        rc(
            2,
            "bash: -c: line 1: syntax error near unexpected token `('\n"
            "bash: -c: line 1: `python -c print(len(x))'\n",
        ),
        "bash: -c: line 1: syntax error near unexpected token `('",
    ),
    "sh syntax error": (
        "sh -c 'for f in *; do echo $f'",
        rc(2, 'sh: 1: Syntax error: end of file unexpected (expecting "done")\n'),
        'sh: 1: Syntax error: end of file unexpected (expecting "done")',
    ),
    "unittest errors": (HEREDOC, rc(1, UNITTEST.format(counts="errors=1")), "FAILED (errors=1)"),
    "unittest failures and errors": (
        HEREDOC,
        rc(1, UNITTEST.format(counts="failures=2, errors=1")),
        "FAILED (failures=2, errors=1)",
    ),
    "syntax error": ("python repro.py", syntax_error(12), 'File "/testbed/repro.py", line 12'),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_latest_error_of_each_shape_survives_a_small_summary(shape: str) -> None:
    command, output, line = SHAPES[shape]
    entries = history(*noise(6), (command, output), ("ls src", rc(0, "parser.py\n")))
    summary = extractive_summary(entries, max_chars=SMALL)
    assert len(summary) <= SMALL
    flat = rules.normalize(summary)
    assert line[:ERROR_KEY_CHARS] in flat  # a long line is clipped past its start
    # As the continuity measure reads the output, and judges the summary.
    failure = rules.failure_of(output, command)
    assert failure is not None
    assert rules.failure_kept(failure, flat), (failure, summary)
    # Pinned, so that a later summary carries it.
    pinned = parse_summary(summary).pinned
    assert pinned
    assert line[:ERROR_KEY_CHARS] in pinned[0]


def test_a_syntax_error_keeps_the_latest_line_not_an_older_one() -> None:
    edit = ("sed -i '9s/(:/():/' repro.py", rc(0, ""))
    entries = history(
        *noise(4), ("python repro.py", syntax_error(9)), edit, ("python repro.py", syntax_error(12))
    )
    summary = extractive_summary(entries, max_chars=SMALL)
    pinned = parse_summary(summary).pinned
    assert pinned == [
        'SyntaxError: invalid syntax · File "/testbed/repro.py", line 12 — after `python repro.py`'
    ]
    # The older run is still listed, after the newer: Blocked is the errors newest first.
    blocked = summary.split("### Blocked")[1].split("\n## ")[0]
    assert blocked.index("line 12") < blocked.index("line 9")


def test_a_previous_summary_error_the_same_run_failed_again_since_is_not_pinned() -> None:
    before = history(
        ("python repro.py", syntax_error(9, "IndentationError: expected an indented block"))
    )
    first = extractive_summary(before, max_chars=SMALL)
    assert parse_summary(first).pinned == [
        "IndentationError: expected an indented block · File"
        ' "/testbed/repro.py", line 9 — after `python repro.py`'
    ]
    later = history(("sed -i 's/x/y/' repro.py", rc(0, "")), ("python repro.py", syntax_error(12)))
    second = extractive_summary(later[1:], previous_summary=first, max_chars=SMALL)
    pinned = parse_summary(second).pinned
    assert pinned == [
        'SyntaxError: invalid syntax · File "/testbed/repro.py", line 12 — after `python repro.py`'
    ]
    assert f"{PINNED_LABEL} IndentationError" not in second
    # Another check's unresolved error stays pinned.
    other = history(("python other.py", rc(0, "ok\n")))
    third = extractive_summary(other[1:], previous_summary=second, max_chars=SMALL)
    assert parse_summary(third).pinned == pinned
    # The same run going well resolves it.
    fixed = history(("python repro.py", rc(0, "ok\n")))
    assert parse_summary(extractive_summary(fixed[1:], previous_summary=second)).pinned == []


OTHERS = [
    (
        "pytest tests/test_a.py -x 2>&1 | tail -30",
        rc(
            0,
            "E   AssertionError: assert 1 == 2\n=== short test summary info ===\n"
            "FAILED tests/test_a.py::test_x - AssertionError: assert 1 == 2\n"
            "=== 1 failed, 4 passed in 0.3s ===\n",
        ),
    ),
    ("grep -rn foo src", rc(1, "")),
    ("cat missing.py", rc(1, "cat: missing.py: No such file or directory\n")),
    ("python -m py_compile repro.py", syntax_error(7, "IndentationError: unexpected indent")),
]
PASSING = [
    ("python analyze_fix.py", rc(0, "ok\n")),
    ("python test_x.py", rc(0, "Ran 3 tests\n\nOK\n")),
    ("python repro.py", rc(0, "done\n")),
    ("sed -n '1,80p' src/x.py", rc(0, "y = 2\n" * 120)),
]
STEPS = [(command, output) for command, output, _ in SHAPES.values()] + OTHERS + PASSING


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 5),
    st.lists(st.sampled_from(STEPS), min_size=1, max_size=6),
    st.sampled_from([1_200, SMALL, 3_000]),
)
def test_the_measure_finds_the_last_failure_and_the_latest_unresolved_one_in_the_summary(
    filler: int, steps: list[tuple[str, str]], size: int
) -> None:
    entries = history(*noise(filler), *steps)
    flat = rules.normalize(extractive_summary(entries, max_chars=size))
    read = [(c, rules.failure_of(o, c)) for c, o in [*noise(filler), *steps]]
    last = next((f for _, f in reversed(read) if f is not None), None)
    if last is not None:
        assert rules.failure_kept(last, flat), last
    anchor = latest_unresolved_error(entries)
    if anchor is not None:
        failure = rules.failure_of(entries[anchor.index].text(), anchor.command)
        if failure is not None:
            assert rules.failure_kept(failure, flat), failure
