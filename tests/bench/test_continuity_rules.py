"""The continuity measurement's own rules (bench/continuity_rules.py), on hand-written
cases: the task's terms, each way a file gets written, each shape of failure, and the
checks against a context."""

from __future__ import annotations

import json

import pytest

from bench import continuity_rules as rules
from bench.continuity_rules import Failure, ShellState, Write


def writes(command: str, state: ShellState | None = None, exit_code: int | None = 0) -> list[str]:
    found = rules.writes_of_call(
        "bash", json.dumps({"command": command}), state or ShellState.new(), exit_code=exit_code
    )
    return [w.path for w in found]


# --- texts ------------------------------------------------------------------------


def test_a_message_says_its_text_and_its_calls_arguments() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me look."}],
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "cat  src/a.py"}'},
            }
        ],
    }
    assert rules.message_text(message) == "Let me look.\nbash\ncat  src/a.py"
    assert rules.context_text([message, {"role": "tool", "content": "x\n\n  y"}]) == (
        "Let me look. bash cat src/a.py x y"
    )


# --- (a) the task's terms -------------------------------------------------------------


def test_task_terms_are_identifiers_paths_and_error_names() -> None:
    request = (
        "<pr_description>\nThe `Schema.load` call fails with TypeError in src/schema.py:\n"
        "my_field is None, and DateTime or PVSystem break; see utils.helpers.parse(). "
        "Also ValueError again, and `x` (too short), and ``` fenced ``` and `the thing`.\n"
        "Plain words such as marshmallow or fields are not terms. e.g. etc. "
        "Version 2.20.0 and ./tools/run.sh. ImproperlyConfiguredException.\n</pr_description>"
    )
    assert rules.task_terms(request) == [
        "Schema.load",
        "the thing",
        "TypeError",
        "src/schema.py",
        "my_field",
        "DateTime",
        "PVSystem",
        "utils.helpers.parse",
        "ValueError",
        "2.20.0",
        "tools/run.sh",
        "ImproperlyConfiguredException",
    ]


def test_task_terms_drop_markup_and_duplicates() -> None:
    text = "<instructions>\nRun `git diff > patch.txt` then patch.txt again</instructions>"
    assert rules.task_terms(text) == ["git diff > patch.txt", "patch.txt"]


def test_terms_are_kept_verbatim_with_whitespace_runs_as_one() -> None:
    terms = ["git diff > patch.txt", "Schema.load", "my_field"]
    text = rules.normalize("ran   git diff >\n patch.txt; called Schema.load")
    assert rules.terms_kept(terms, text) == ["git diff > patch.txt", "Schema.load"]


# --- (b) modified files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("edit", {"file_path": "/testbed/src/a.py", "old_string": "x"}, ["src/a.py"]),
        ("write", {"path": "notes.md", "content": "hi"}, ["notes.md"]),
        ("str_replace_editor", {"command": "create", "path": "/testbed/b.py"}, ["b.py"]),
        ("str_replace_editor", {"command": "str_replace", "path": "/testbed/b.py"}, ["b.py"]),
        ("str_replace_editor", {"command": "view", "path": "/testbed/b.py"}, []),
        ("read_file", {"path": "/testbed/b.py"}, []),
        (
            "apply_patch",
            {"input": "*** Begin Patch\n*** Update File: src/c.py\n@@\n-a\n+b\n*** End Patch"},
            ["src/c.py"],
        ),
        ("apply_patch", {"patch": "--- a/src/d.py\n+++ b/src/d.py\n@@ -1 +1 @@\n"}, ["src/d.py"]),
    ],
)
def test_edit_and_patch_tools_modify_the_files_they_name(
    name: str, arguments: dict[str, str], expected: list[str]
) -> None:
    found = rules.writes_of_call(name, json.dumps(arguments), ShellState.new(), exit_code=None)
    assert [w.path for w in found] == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # sed -i, in its spellings; sed without -i writes nothing.
        ("sed -i 's/a/b/' src/a.py", ["src/a.py"]),
        ("sed -i.bak -e 's/a/b/' -e 's/c/d/' src/a.py src/b.py", ["src/a.py", "src/b.py"]),
        ("sed --in-place 's/a/b/' a.py", ["a.py"]),
        ("sed -ni '/x/p' a.py", ["a.py"]),
        ("sed -n '1,20p' src/a.py", []),
        ("sed 's/a/b/' a.py > b.py", ["b.py"]),
        # perl -i.
        ("perl -pi -e 's/a/b/' lib/x.pm", ["lib/x.pm"]),
        ("perl -i.bak -pe 's/a/b/' x.txt", ["x.txt"]),
        ("perl -ne 'print' x.txt", []),
        # Redirections: not a descriptor, not /dev; quotes and heredoc bodies are text.
        ("echo hi > out.txt", ["out.txt"]),
        ("printf x >> log/run.log", ["log/run.log"]),
        ("python run.py &> run.out", ["run.out"]),
        ("python run.py 2>/dev/null", []),
        ("python run.py 2>&1 | head", []),
        ("python run.py > /dev/null 2>&1", []),
        ('python -c "print(1 > 0)"', []),
        ("echo 'a > b' | grep a", []),
        # A quoted operator alone is a word, not a redirection nor a separator.
        ('grep -n ">" notes.txt', []),
        ("echo ';' > semi.txt", ["semi.txt"]),
        ("awk -F'|' '{print $1}' t.csv > cols.txt", ["cols.txt"]),
        ("grep -c \"it's\" a.txt # don't\necho x > after.txt", ["after.txt"]),
        ("cat <<'EOF' > conf.ini\n[a]\nx = 1 > 0\nEOF", ["conf.ini"]),
        ("cat > conf.ini << EOF\nredirect > not_a_file\nEOF\ncat conf.ini", ["conf.ini"]),
        # tee.
        ("python t.py | tee -a result.txt", ["result.txt"]),
        ("tee a.txt b.txt < in.txt", ["a.txt", "b.txt"]),
        # git diff to a file is a write too.
        ("git diff -- src/a.py > patch.txt", ["patch.txt"]),
        # cd before, relative paths after it; absolute ones outside the workdir stay.
        ("cd /testbed/src && sed -i 's/a/b/' pkg/m.py", ["src/pkg/m.py"]),
        ("cd /tmp && echo x > t.py", ["/tmp/t.py"]),
        ("echo x > /testbed/./src/../setup.py", ["setup.py"]),
        ("echo x > ./rel.py", ["rel.py"]),
        # Comments are not commands; run-time paths are not counted.
        ("# sed -i 's/a/b/' note.py\nls", []),
        ("ls # > x.txt\necho y > y.txt", ["y.txt"]),
        ('for f in *.py; do sed -i "s/a/b/" "$f"; done', []),
        ('echo x > "$OUT"', []),
        # Not writes by the rule.
        ("cp a.py b.py && mv c.py d.py && rm e.py && touch f.py", []),
    ],
)
def test_shell_commands_that_write_files(command: str, expected: list[str]) -> None:
    assert writes(command) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("python -c \"open('src/a.py', 'w').write('x')\"", ["src/a.py"]),
        ("python3 -c \"open('a.txt', mode='a').write('x')\"", ["a.txt"]),
        ("python -c \"open('a.py', 'r+')\"", ["a.py"]),
        ("python -c \"print(open('a.py').read())\"", []),
        ("python -c \"open('a.py', 'r')\"", []),
        (
            "python3 - <<'EOF'\nfrom pathlib import Path\nPath('/testbed/pkg/m.py').write_text(s)\nEOF",
            ["pkg/m.py"],
        ),
        (
            "python << EOF\nimport os\npath = os.path.join('pkg', 'n.py')\n"
            "with open(path) as f:\n    s = f.read()\nwith open(path, 'w') as f:\n"
            "    f.write(s)\nEOF",
            ["pkg/n.py"],
        ),
        (
            "python -c \"\nfrom pathlib import Path\np = Path('o.py')\np.write_bytes(b'')\n\"",
            ["o.py"],
        ),
        ("python -c \"open(name, 'w')\"", []),  # a name never assigned a literal
        ("python -c \"open(f'{d}/x.py', 'w')\"", []),  # an f-string with a field
    ],
)
def test_python_code_that_writes_files(command: str, expected: list[str]) -> None:
    assert writes(command) == expected


def test_a_script_the_trace_wrote_modifies_its_files_when_it_runs() -> None:
    state = ShellState.new()
    script = "cat > fix.py << 'EOF'\nwith open('src/lib.py', 'w') as f:\n    f.write('x')\nEOF"
    assert writes(script, state) == ["fix.py"]
    assert writes("cd /testbed && python fix.py", state) == ["src/lib.py"]
    assert writes("python other.py", state) == []  # never seen written: unknown


PATCH = "--- a/src/lib.py\n+++ b/src/lib.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_patches_modify_their_plus_plus_plus_files_when_they_apply() -> None:
    state = ShellState.new()
    assert writes(f"cat > fix.patch << 'EOF'\n{PATCH}EOF", state) == ["fix.patch"]
    assert writes("git apply fix.patch", state) == ["src/lib.py"]
    assert writes("git apply --check fix.patch", state) == []
    assert writes("git apply fix.patch", state, exit_code=1) == []  # did not apply
    assert writes("patch -p1 < fix.patch", state) == ["src/lib.py"]
    assert writes("patch -p1 -i fix.patch", state) == ["src/lib.py"]
    assert writes("patch --dry-run -p1 < fix.patch", state) == []
    assert writes(f"git apply - <<'EOF'\n{PATCH}EOF") == ["src/lib.py"]
    assert writes(f"patch -p1 << 'EOF'\n{PATCH.replace('lib', 'other')}EOF") == ["src/other.py"]
    assert writes("patch src/x.py < fix.diff") == ["src/x.py"]  # the file named outright
    assert writes("git apply unknown.patch") == []  # its text was never seen


def test_writes_say_how() -> None:
    found = rules.writes_of_call(
        "bash", {"command": "sed -i s/a/b/ a.py && echo > b.py"}, ShellState.new()
    )
    assert found == [Write("a.py", "sed -i"), Write("b.py", "redirect")]


def test_a_file_is_named_as_a_path_not_inside_a_longer_name() -> None:
    text = "edited /testbed/src/lib.py and ./tools/run.sh, then /tmp/t.py; test_x.py.bak"
    assert rules.named_in(text, "src/lib.py")
    assert rules.named_in(text, "tools/run.sh")
    assert rules.named_in(text, "/tmp/t.py")
    assert not rules.named_in(text, "lib.py")  # a shorter path is another file
    assert not rules.named_in(text, "x.py")
    assert not rules.named_in(text, "test_x.py")  # only as test_x.py.bak
    assert not rules.named_in(text, "t.py")
    assert rules.named_in("the file `src/lib.py`.", "src/lib.py")


def test_the_modified_files_section_lists_paths_resolved_like_the_writes() -> None:
    summary = (
        "<summary>\n<read-files>\nsrc/read.py\n</read-files>\n<modified-files>\n"
        "/testbed/src/lib.py\n./b.py\n/tmp/t.py\n(and 3 more)\n</modified-files>\n</summary>"
    )
    assert rules.listed_modified(summary) == {"src/lib.py", "b.py", "/tmp/t.py"}
    assert rules.listed_modified("<summary>no files</summary>") is None


# --- (c) failures ---------------------------------------------------------------------


def output(code: int, body: str) -> str:
    """A tool output as mini-swe-agent records it."""
    return f"<returncode>{code}</returncode>\n<output>\n{body}\n</output>"


@pytest.mark.parametrize(
    ("text", "kind", "line"),
    [
        (
            output(
                1,
                'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
                "    import django\ndjango.core.exceptions.ImproperlyConfigured: settings missing",
            ),
            "traceback",
            "django.core.exceptions.ImproperlyConfigured: settings missing",
        ),
        (
            output(
                130, 'Traceback (most recent call last):\n  File "x.py", line 3\nKeyboardInterrupt'
            ),
            "traceback",
            "KeyboardInterrupt",
        ),
        (
            output(
                1, '  File "t.py", line 19\n    print(f"{}")\n    ^\nSyntaxError: f-string: empty'
            ),
            "syntax-error",
            "SyntaxError: f-string: empty",
        ),
        (
            output(0, "caught:\npydicom.errors.InvalidDicomError: not DICOM"),
            "exception",
            "pydicom.errors.InvalidDicomError: not DICOM",
        ),
        (
            output(
                1,
                "    def test_x():\n>       assert f() == 2\nE       AssertionError: assert 1 == 2",
            ),
            "exception",
            "E       AssertionError: assert 1 == 2",
        ),
        (
            output(
                1,
                "E   ValueError: bad\n=== short test summary info ===\n"
                "FAILED tests/test_a.py::test_x - ValueError: bad\n=== 1 failed in 0.1s ===",
            ),
            "pytest",
            "FAILED tests/test_a.py::test_x - ValueError: bad",
        ),
        (
            output(2, "ERROR tests/test_b.py - ImportError: cannot import name 'x'"),
            "pytest",
            "ERROR tests/test_b.py - ImportError: cannot import name 'x'",
        ),
        (output(0, "Running...\nError: value is None"), "tool-error", "Error: value is None"),
        (output(128, "fatal: not a git repository"), "tool-error", "fatal: not a git repository"),
        (output(127, "bash: line 1: pytst: command not found"), "tool-error", None),
        (output(2, "ls: cannot access 'x': No such file or directory"), "tool-error", None),
        (output(128, "error: corrupt patch at line 14"), "patch", None),
        (output(1, "error: src/a.py: patch does not apply"), "patch", None),
        (output(2, "patch: **** malformed patch at line 35: foo"), "patch", None),
        (
            output(1, "Hunk #1 FAILED at 12.\n1 out of 1 hunk FAILED"),
            "patch",
            "1 out of 1 hunk FAILED",
        ),
        (output(0, "Invalid patch: no hunks"), "patch", None),
        # Exit status alone: the last line, or the command when there is none.
        (output(1, "sed: -e expression #1, char 5: unterminated `s' command"), "exit-code", None),
        ("Exit code: 3\nsomething odd happened", "exit-code", "something odd happened"),
        ("last words\n[Process exited with code 2]", "exit-code", "last words"),
    ],
)
def test_each_shape_of_failure(text: str, kind: str, line: str | None) -> None:
    failure = rules.failure_of(text, "python run.py")
    assert failure is not None
    assert failure.kind == kind
    expected = line if line is not None else text.splitlines()[2]
    assert failure.line == expected


@pytest.mark.parametrize(
    "text",
    [
        output(0, "all good\n5 passed in 0.2s"),
        output(0, "    except ValueError:\n        raise"),  # code, not an error line
        output(0, "45:class ParseError(Exception):"),
        output(0, "DeprecationWarning: old"),
        output(0, "<warning>long output</warning>"),
    ],
)
def test_outputs_that_did_not_fail(text: str) -> None:
    assert rules.failure_of(text, "cat x.py") is None


def test_a_search_that_finds_nothing_did_not_fail() -> None:
    assert rules.failure_of(output(1, ""), "cd /testbed && grep -n foo src/a.py") is None
    assert rules.failure_of(output(1, ""), "pip list | grep -E numpy") is None
    assert rules.failure_of(output(1, ""), "diff a b") is None
    # Its pattern quoted: ";;" is the pattern, grep still the last command (found in
    # the traces: cd /testbed && grep -n ";;" test/core/linter_test.py -B2 -A2).
    assert rules.failure_of(output(1, ""), 'cd /t && grep -n ";;" t.py -B2 -A2') is None
    assert rules.failure_of(output(1, ""), "grep -c '|' a.txt") is None
    assert rules.failure_of(output(1, ""), "echo ';' | python check.py") is not None
    # grep's 2 is an error; a failing command with no output is named by its command.
    assert rules.failure_of(output(2, ""), "grep -n foo missing.py") == Failure(
        "exit-code", "grep -n foo missing.py", 2
    )
    assert rules.failure_of(output(1, ""), "make build") == Failure("exit-code", "make build", 1)


def test_an_error_tool_result_fails_without_an_exit_status() -> None:
    assert rules.failure_of("permission denied", None, is_error=True) == Failure(
        "exit-code", "permission denied", None
    )
    assert rules.failure_of("permission denied", None) is None


def test_the_last_error_line_of_an_output_is_its_failure() -> None:
    text = output(
        1,
        'Traceback (most recent call last):\n  File "a.py"\nKeyError: 1\n\n'
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py"\nRuntimeError: wrapped',
    )
    assert rules.failure_of(text) == Failure("traceback", "RuntimeError: wrapped", 1)


def test_a_tag_after_a_traceback_is_not_its_error() -> None:
    text = '<output_head>\nTraceback (most recent call last):\n  File "a.py"\n</output_head>'
    assert rules.error_lines(text) == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<returncode>0</returncode>", 0),
        ("<returncode>-1</returncode>", -1),
        ("Exit code: 2", 2),
        ("command failed with exit code 127", 127),
        ("exit status 3", 3),
        ("Process exited with code 1", 1),
        ("no status here", None),
        ("exit code 1 then <returncode>0</returncode>", 0),
    ],
)
def test_exit_codes(text: str, code: int | None) -> None:
    assert rules.exit_code(text) == code


def test_a_failure_is_kept_by_a_context_holding_its_key() -> None:
    long = "AttributeError: 'Linter' object has no attribute 'fix_string'. Did you mean: " + (
        "'lint_string'? " * 5
    )
    failure = Failure("exception", long, 1)
    assert len(failure.key) == rules.KEY_CHARS
    assert rules.failure_kept(failure, rules.normalize("the summary says " + long[:90] + " …"))
    assert not rules.failure_kept(failure, "AttributeError: 'Linter' object")
    pytest_line = Failure("exception", "E       AssertionError:   assert 1 == 2", 1)
    assert pytest_line.key == "AssertionError: assert 1 == 2"
    assert rules.failure_kept(pytest_line, "last error: AssertionError: assert 1 == 2")


# The latest error of any shape: a script's traceback, a framework's exception through a
# pipe, a shell's syntax error, unittest's summary, a syntax error and where it is.

FRAMES = (
    '  File "/testbed/django/test/utils.py", line 125, in setup_test_environment\n'
    "    settings.DEBUG = debug\n"
    '  File "/testbed/django/conf/__init__.py", line 57, in _setup\n'
    "    raise ImproperlyConfigured(\n"
)
IMPROPERLY = (
    "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG, but not configured"
)


def test_a_script_run_fails_with_its_traceback_last_line() -> None:
    text = output(
        1,
        'Traceback (most recent call last):\n  File "/testbed/analyze_fix.py", line 14, in'
        " <module>\n    print(foo)\nNameError: name 'foo' is not defined\nCase 1: ok",
    )
    assert rules.failure_of(text, "python analyze_fix.py") == Failure(
        "traceback", "NameError: name 'foo' is not defined", 1
    )


def test_a_framework_exception_through_a_pipe_even_without_its_header() -> None:
    command = "python manage.py test 2>&1 | tail -300"
    whole = output(0, "Traceback (most recent call last):\n" + FRAMES + IMPROPERLY)
    assert rules.failure_of(whole, command) == Failure("traceback", IMPROPERLY, 0)
    headless = output(0, FRAMES + IMPROPERLY + "\n")
    assert rules.failure_of(headless, command) == Failure("traceback", IMPROPERLY, 0)
    # Frames quoted in prose are no traceback: the next line is not an exception's name.
    quoted = output(0, '  File "a.py", line 3, in f\n    g()\nwas the last frame shown')
    assert rules.failure_of(quoted, "cat notes.md") is None


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            "bash: -c: line 1: syntax error near unexpected token `('\n"
            "bash: -c: line 1: `python -c print(len(x))'",
            "bash: -c: line 1: syntax error near unexpected token `('",
        ),
        ('/bin/sh: 1: Syntax error: "(" unexpected', '/bin/sh: 1: Syntax error: "(" unexpected'),
        (
            "bash: -c: line 1: unexpected EOF while looking for matching `''\n"
            "bash: -c: line 2: syntax error: unexpected end of file",
            "bash: -c: line 2: syntax error: unexpected end of file",
        ),
    ],
)
def test_a_shell_syntax_error_not_the_command_it_echoes(body: str, line: str) -> None:
    assert rules.failure_of(output(2, body), "python -c print(len(x))") == Failure(
        "shell-syntax", line, 2
    )


@pytest.mark.parametrize("summary", ["FAILED (errors=1)", "FAILED (failures=2, errors=1)"])
def test_a_unittest_summary_is_the_failure_of_its_run(summary: str) -> None:
    body = (
        "ERROR: test_parse (__main__.TestParse.test_parse)\n" + "-" * 70 + "\n"
        'Traceback (most recent call last):\n  File "/testbed/test_x.py", line 9, in test_parse\n'
        "    parse()\nTypeError: parse() missing 1 required positional argument: 'b'\n\n"
        + "-" * 70
        + f"\nRan 3 tests in 0.001s\n\n{summary}"
    )
    command = "cat <<'EOF' > test_x.py && python test_x.py\nimport unittest\nEOF"
    assert rules.failure_of(output(1, body), command) == Failure("unittest", summary, 1)
    assert rules.failure_of(output(0, body), "python test_x.py | tail -20") == Failure(
        "unittest", summary, 0
    )


def test_a_syntax_error_is_kept_with_where_it_is() -> None:
    def run(line: int) -> str:
        return output(
            1,
            f'  File "/testbed/repro.py", line {line}\n    def f(:\n          ^\n'
            "SyntaxError: invalid syntax",
        )

    failure = rules.failure_of(run(12), "python repro.py")
    assert failure == Failure(
        "syntax-error", "SyntaxError: invalid syntax", 1, 'File "/testbed/repro.py", line 12'
    )
    older = rules.normalize(
        'SyntaxError: invalid syntax — after python repro.py File "/testbed/repro.py", line 9'
    )
    newer = older.replace("line 9", "line 12")
    assert not rules.failure_kept(failure, older)
    assert rules.failure_kept(failure, newer)
    # In a traceback, and as pytest quotes it.
    imported = output(
        1,
        'Traceback (most recent call last):\n  File "r.py", line 1, in <module>\n    import repro\n'
        '  File "/testbed/repro.py", line 12\n    def f(:\n          ^\nSyntaxError: invalid syntax',
    )
    assert rules.failure_of(imported, "python r.py") == failure
    collected = output(
        2,
        'E     File "/testbed/repro.py", line 12\nE       def f(:\nE             ^\n'
        "E   SyntaxError: invalid syntax",
    )
    assert rules.failure_of(collected, "pytest") == Failure(
        "syntax-error", "E   SyntaxError: invalid syntax", 2, 'File "/testbed/repro.py", line 12'
    )
