"""What a compaction's details index of the entries it summarized (issue 16, "What was
dropped"): app.engine.compaction.dropped, by kind, bounded, on generated input and on the traces."""

from __future__ import annotations

import contextlib
import importlib
import json
import posixpath
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction import branch_summary, dropped
from app.engine.compaction import prepare as engine
from app.engine.compaction.anchors import FALLBACK, command_of, outcome
from app.engine.compaction.dropped import KINDS, command_lines, index
from app.engine.compaction.fileops import collect
from app.engine.formats.openai_format import parse_message
from app.engine.model import Entry, Part
from tests.engine.strategies import JSON_OBJECTS
from tests.traces import load, trace_files

# --- Building entries -------------------------------------------------------------------


def user(text: str) -> Entry:
    return Entry(role="user", parts=[{"type": "text", "text": text}])


def say(text: str, *calls: Part) -> Entry:
    parts: list[Part] = [{"type": "text", "text": text}] if text else []
    return Entry(role="assistant", parts=[*parts, *calls])


def call(call_id: str, name: str, arguments: dict[str, Any] | str) -> Part:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": raw}


def bash(call_id: str, command: str) -> Part:
    return call(call_id, "bash", {"command": command})


def result(call_id: str, output: str, *, is_error: bool = False) -> Entry:
    return Entry(
        role="tool",
        parts=[{"type": "text", "text": output}],
        tool_call_id=call_id,
        is_error=is_error,
    )


def listed(entries: list[Entry], kind: str, **kwargs: Any) -> list[str]:
    values: list[str] = index(entries, **kwargs)[kind]["first"]
    return values


# --- Paths ------------------------------------------------------------------------------


def test_paths_are_the_files_the_calls_touch_and_the_words_that_look_like_paths() -> None:
    entries = [
        user(
            "Fix the parser in src/dates.py (see docs/guide/intro), and/or w/o the "
            "sed s/a/b/g; not np.log(x) nor self.json. Also .gitignore and .index."
        ),
        say(
            "",
            call("c1", "str_replace_based_edit_tool", {"command": "view", "path": "Makefile"}),
            call("c2", "write_file", {"path": "notes/TODO", "content": "later"}),
        ),
        result("c1", "<output>\n/testbed/src/dates.py:12: in parse\n</output>"),
    ]
    assert listed(entries, "paths") == [
        "src/dates.py",
        "docs/guide/intro",
        ".gitignore",
        "Makefile",
        # Not path-looking, but the write tool named it.
        "notes/TODO",
        "/testbed/src/dates.py",
    ]


def test_a_file_is_named_as_written_where_the_entries_name_it() -> None:
    # The file ops resolve ``x.py`` under the ``cd``: the index lists what was written.
    entries = [say("", bash("c1", "cd /testbed && sed -i 's/a/b/' ./pkg/x.py"))]
    assert collect(entries).modified == ("/testbed/pkg/x.py",)
    assert listed(entries, "paths") == ["/testbed", "./pkg/x.py"]


# --- Commands ---------------------------------------------------------------------------

SCRIPT = """\
cd /testbed && python -m pytest tests/test_x.py -q \\
  -k parse
# a comment
cat > fix.py << 'EOF'
import os
print('not a command')
EOF
if true; then
  echo "a
b"
fi
pytest | tail -5 &&
  echo done"""


def test_commands_are_the_lines_a_shell_runs_without_here_document_bodies() -> None:
    assert command_lines(SCRIPT) == [
        "cd /testbed && python -m pytest tests/test_x.py -q \\\n  -k parse",
        "cat > fix.py << 'EOF'",
        "if true; then",
        'echo "a\nb"',
        "pytest | tail -5 &&\n  echo done",
    ]


def test_commands_come_from_shell_calls_only() -> None:
    entries = [
        say(
            "Running it.",
            bash("c1", SCRIPT),
            call("c2", "local_shell", {"command": ["ls", "-la"]}),
            call("c3", "str_replace_editor", {"command": "view", "path": "a.py"}),
            call("c4", "bash", "{not json"),
            bash("c5", "ls -la"),  # run twice: listed once
            bash("c6", "echo 'unclosed"),
        )
    ]
    assert listed(entries, "commands") == [*command_lines(SCRIPT), "ls -la"]


# --- Errors -----------------------------------------------------------------------------

PYTEST_FAILURE = """\
<returncode>1</returncode>
<output>
tests/test_x.py .F.                                                      [100%]
=================================== FAILURES ===================================
    def test_y():
>       assert parse("") == 1
E       AssertionError: assert 0 == 1

tests/test_x.py:12: AssertionError
=========================== short test summary info ============================
FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1
========================= 1 failed, 2 passed in 0.05s ==========================
</output>"""


def test_errors_are_the_lines_that_say_what_failed_in_the_order_written() -> None:
    entries = [
        say("", bash("c1", "pytest tests -x"), bash("c2", "make build"), bash("c3", "ls")),
        result("c1", PYTEST_FAILURE),
        # A failure told by its exit code only: its last line is no error line.
        result("c2", "<returncode>2</returncode>\n<output>\nbuilding...\n</output>"),
        result("c3", "<returncode>0</returncode>\n<output>\nerror_handling.py\n</output>"),
    ]
    expected = [
        line.text
        for line in outcome(PYTEST_FAILURE, command="pytest tests -x").lines
        if line.rank != FALLBACK
    ]
    errors = listed(entries, "errors")
    assert "FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1" in errors
    assert sorted(errors) == sorted(expected)
    assert errors == sorted(errors, key=PYTEST_FAILURE.find)
    assert "building..." not in errors


def test_a_tool_error_and_an_error_the_user_pasted_count() -> None:
    entries = [
        user(
            "It fails:\nTraceback (most recent call last):\n"
            '  File "app.py", line 3, in <module>\n    main()\n'
            "KeyError: 'date_format'\nPlease fix."
        ),
        say("", call("c1", "read_file", {"path": "cfg.toml"})),
        result("c1", "File not found: cfg.toml", is_error=True),
    ]
    assert listed(entries, "errors") == [
        'File "app.py", line 3, in <module>',
        "KeyError: 'date_format'",
        "File not found: cfg.toml",
    ]


# --- Identifiers, numbers, URLs ---------------------------------------------------------


def test_identifiers_are_code_names_not_words() -> None:
    text = (
        "Call parse_date from app.engine.dates via os.path.join; the DateParser raises "
        "ValueError. Also std::io::Error and getUserName, List<MyType> in <output>, "
        "but not Hello, URLs, e.g. or example.com, nor a 3.14 or __ alone."
    )
    assert listed([user(text)], "identifiers") == [
        "parse_date",
        "app.engine.dates",
        "os.path.join",
        "DateParser",
        "ValueError",
        "std::io::Error",
        "getUserName",
        "MyType",
    ]


def test_arguments_are_read_as_values_never_as_keys() -> None:
    entries = [
        say(
            "",
            call("c1", "edit", {"file_path": "a.py", "old_string": "x", "new_string": "MAX_RETRY"}),
        )
    ]
    assert listed(entries, "identifiers") == ["MAX_RETRY"]  # not file_path, old_string


NUMBERS_TEXT = (
    "numpy==1.24 and pandas>=2.0.3, v1.2, 1.2.3rc1; port 8080, localhost:5432, "
    "--port 9000, PORT=3000; issue #123, pid 4242, commit 3f2a9c1 and abcdef1, "
    "id 550e8400-e29b-41d4-a716-446655440000 and c0ffee00-e29b-41d4-a716-446655440000; "
    "took 250 ms, 1.5 GB, 12,000 tokens, 95%; row 1234567; "
    "not 3, 42, 3.14, x=0.5, 0 days, line 12, 2024, 404 or 0xff."
)


def test_numbers_are_the_specific_ones() -> None:
    assert listed([user(NUMBERS_TEXT)], "numbers") == [
        "1.24",
        "2.0.3",
        "v1.2",
        "1.2.3rc1",
        "port 8080",
        "localhost:5432",
        "--port 9000",
        "PORT=3000",
        "#123",
        "pid 4242",
        "3f2a9c1",
        "abcdef1",
        "550e8400-e29b-41d4-a716-446655440000",
        "c0ffee00-e29b-41d4-a716-446655440000",
        "250 ms",
        "1.5 GB",
        "12,000 tokens",
        "95%",
        "1234567",
    ]


def test_urls_without_their_trailing_punctuation() -> None:
    text = "See https://example.com/a?b=1, (https://docs.x.org/y). Then ws://h:9/z."
    entries = [user(text), result("c", "fetched https://example.com/a?b=1")]
    assert listed(entries, "urls") == [
        "https://example.com/a?b=1",
        "https://docs.x.org/y",
        "ws://h:9/z",
    ]


# --- Counts, the first N, what is stored ------------------------------------------------


def test_counts_are_distinct_and_first_lists_the_earliest() -> None:
    paths = [f"src/mod{i}.py" for i in range(30)]
    entries = [user(" ".join(paths)), user(" ".join(reversed(paths)))]
    ix = index(entries, first=5)
    assert ix["paths"] == {"count": 30, "first": paths[:5]}
    assert index(entries, first=0)["paths"] == {"count": 30, "first": []}
    assert index(entries)["paths"]["first"] == paths[: dropped.FIRST]
    assert set(ix) == {*KINDS, "truncated"}
    assert ix["truncated"] is False
    assert index([]) == {**{k: {"count": 0, "first": []} for k in KINDS}, "truncated": False}


def test_values_are_cut_and_never_hold_what_a_json_column_refuses() -> None:
    long_path = "src/" + "a" * 250 + ".py"  # a word, longer than a value
    entries = [
        user(long_path),
        say("", bash("c1", "echo a\x00b"), bash("c2", "echo fine")),
    ]
    ix = index(entries)
    assert ix["paths"]["first"] == [long_path[: dropped.VALUE_CHARS]]
    assert ix["commands"]["first"] == ["echo fine"]


# --- Bounded ----------------------------------------------------------------------------


def test_a_long_output_is_read_at_its_head_and_its_end() -> None:
    filler = "\n".join(f"plain line {i} of the output" for i in range(4_000))
    output = f"src/head.py\n{filler}\nsrc/middle.py\n{filler}\n" + (
        'Traceback (most recent call last):\n  File "run.py", line 1, in <module>\n'
        "ValueError: boom\n"
    )
    assert len(output) > 4 * dropped.ENTRY_CHARS
    entries = [say("", bash("c1", "python run.py")), result("c1", output)]
    ix = index(entries)
    assert ix["truncated"] is True
    assert ix["paths"]["first"] == ["run.py", "src/head.py"]
    assert ix["errors"]["first"] == ['File "run.py", line 1, in <module>', "ValueError: boom"]


def test_the_work_is_bounded_by_what_is_read() -> None:
    """Entries full of distinct paths: every value found was read, and each takes at least
    its length and a separator, so the values found bound what was read from below; they
    stay within TOTAL_CHARS."""
    entries = [
        result(f"c{e}", " ".join(f"d{e:03d}/f{i:05d}.py" for i in range(5_000))) for e in range(200)
    ]
    assert sum(len(entry.text()) for entry in entries) > 20 * dropped.TOTAL_CHARS
    ix = index(entries, first=10**6)
    found = ix["paths"]["first"]
    assert ix["truncated"] is True
    assert ix["paths"]["count"] == len(found) > 1_000
    # Each value read took its length and a separator (but the last of an entry's head
    # and of its end): what was found was read, and no more than TOTAL_CHARS was.
    assert sum(len(p) + 1 for p in found) <= dropped.TOTAL_CHARS + 2 * len(entries)
    # Every entry read has its head and its end read: its first and last words.
    assert found[0] == "d000/f00000.py"
    assert "d000/f04999.py" in found


def _regex_parser() -> Any:
    return importlib.import_module("re._parser")


def _unbounded(pattern: re.Pattern[str]) -> list[tuple[Any, bool]]:
    """The repeats of ``pattern`` with no upper bound: each one's body, and whether it
    ends the pattern (nothing after it can fail, so it is read once)."""
    parser = _regex_parser()
    repeats = {parser.MAX_REPEAT, parser.MIN_REPEAT, parser.POSSESSIVE_REPEAT}
    found: list[tuple[Any, bool]] = []

    def walk(items: Any, at_end: bool) -> None:
        items = list(items)
        for k, (op, av) in enumerate(items):
            last = at_end and k == len(items) - 1
            if op in repeats:
                _low, high, body = av
                if high == parser.MAXREPEAT:
                    found.append((list(body), last))
                walk(body, False)
            elif op is parser.SUBPATTERN:
                walk(av[-1], last)
            elif op is parser.BRANCH:
                for branch in av[1]:
                    walk(branch, last)
            elif op in (parser.ASSERT, parser.ASSERT_NOT):
                walk(av[1], False)

    walk(parser.parse(pattern.pattern, pattern.flags), True)
    return found


def test_no_pattern_can_backtrack_catastrophically() -> None:
    """The bound on work, shown on the patterns themselves: those that search a text
    repeat without bound only a single character class, as the last thing they match (so
    a match attempt reads a run once); the word pattern starts only at a word's first
    character and its runs never leave the word."""
    parser = _regex_parser()
    single = {parser.IN, parser.LITERAL, parser.NOT_LITERAL, parser.ANY, parser.CATEGORY}
    searching = [
        dropped._DIGIT_FIRST,
        dropped._SIGN_FIRST,
        dropped._HEX_FIRST,
        dropped._URL,
        dropped._HEREDOC,
        # On one word of at most TOKEN_CHARS:
        dropped._PATHISH,
        dropped._IDENTIFIER,
        dropped._SCOPED,
        dropped._CAMEL,
        dropped._ALPHA,
    ]
    for pattern in searching:
        for body, last in _unbounded(pattern):
            assert last, pattern.pattern
            assert [op for op, _ in body] in ([op] for op in single), pattern.pattern
    # The word pattern: a lookbehind first (no separator may precede), and every
    # unbounded run is of the word's own characters.
    items = list(parser.parse(dropped._WORD.pattern))
    assert items[0][0] is parser.ASSERT_NOT
    assert items[0][1][0] == -1
    word_class = list(parser.parse(f"[^{dropped._SEP}]"))
    runs = _unbounded(dropped._WORD)
    assert runs
    assert all(body == word_class for body, _ in runs)


PATHOLOGICAL = [
    "1," * 40_000,
    "a" * 80_000,
    "/" * 80_000,
    "v1." * 30_000,
    "localhost:" * 8_000,
    "<<" * 40_000,
    "'\"" * 40_000,
    "1." * 40_000,
    "-1" * 40_000,
    "a_" * 40_000,
    "ab." * 30_000,
    "#1" * 40_000,
    "x/" * 40_000,
    "1" * 80_000,
    "a1" * 40_000,
    "Traceback (most recent call last):\n" * 2_000,
    "\\\n" * 40_000,
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda t: repr(t[:12]))
def test_pathological_input_is_read_within_the_bound(text: str) -> None:
    entries = [
        user(text),
        say(text, bash("c1", text)),
        result("c1", text, is_error=True),
    ]
    ix = index(entries)
    assert ix["truncated"] is True
    for kind in KINDS:
        assert all(len(v) <= dropped.VALUE_CHARS for v in ix[kind]["first"])


# --- Properties -------------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        " ",
        "\n",
        "src/a.py",
        "./b/c.txt",
        "/testbed/x",
        "Makefile",
        ".gitignore",
        "np.log(",
        "self.json",
        "parse_date",
        "getUserName",
        "os.path.join",
        "a::b",
        "TypeError: bad\n",
        "Traceback (most recent call last):\n",
        "FAILED tests/t.py::test_x - AssertionError\n",
        "<returncode>1</returncode>",
        "==1.2",
        "v2.0.1",
        "localhost:8080",
        "--port 99",
        "#12",
        "pid 7",
        "3f2a9c1",
        "250 ms",
        "12,000 tokens",
        "95%",
        "https://e.com/p?q=1.",
        "<<'EOF'\n",
        "EOF\n",
        "&&\n",
        "\\\n",
        "'",
        '"',
        "# c\n",
        "<",
        ">",
        "(",
        ":",
        "\x00",
        "\u00e9",
        "\u2028",
    ]
)
TEXTS = st.lists(FRAGMENTS | st.text(max_size=8), max_size=24).map("".join)
ARGUMENTS = st.one_of(
    TEXTS.map(lambda c: json.dumps({"command": c})),
    st.lists(TEXTS, max_size=3).map(lambda argv: json.dumps({"cmd": argv})),
    st.tuples(TEXTS, TEXTS).map(
        lambda pt: json.dumps({"command": "str_replace", "path": pt[0], "new_str": pt[1]})
    ),
    JSON_OBJECTS.map(json.dumps),
    st.text(max_size=20),
)
NAMES = st.sampled_from(["bash", "shell", "str_replace_based_edit_tool", "write", "lookup"])


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    entries: list[Entry] = []
    for k in range(draw(st.integers(0, 6))):
        role = draw(st.sampled_from(["user", "assistant", "tool"]))
        if role == "user":
            entries.append(user(draw(TEXTS)))
        elif role == "assistant":
            calls = [
                call(f"c{k}_{j}", draw(NAMES), draw(ARGUMENTS))
                for j in range(draw(st.integers(0, 2)))
            ]
            entries.append(say(draw(TEXTS), *calls))
        else:
            calls_so_far = [c for e in entries for c in e.call_ids] or ["none"]
            entries.append(
                result(
                    draw(st.sampled_from(calls_so_far)), draw(TEXTS), is_error=draw(st.booleans())
                )
            )
    return entries


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            out.append(" ".join(value))  # an argv, as the commands list it
        for item in value:
            _strings(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)


def haystack(entries: list[Entry]) -> list[str]:
    """Every text the entries hold: texts, outputs, and the arguments' string values."""
    out: list[str] = []
    for entry in entries:
        out.append(entry.text())
        for part in entry.tool_calls():
            with contextlib.suppress(orjson.JSONDecodeError):
                _strings(orjson.loads(part["arguments"]), out)
    return out


@settings(max_examples=300, deadline=None)
@given(entries=histories(), first=st.integers(0, 30))
def test_any_history_gives_a_sound_bounded_index(entries: list[Entry], first: int) -> None:
    ix = index(entries, first=first)
    assert ix == index(entries, first=first)  # deterministic
    assert set(ix) == {*KINDS, "truncated"}
    texts = haystack(entries)
    for kind in KINDS:
        count, values = ix[kind]["count"], ix[kind]["first"]
        assert count >= len(values)
        assert len(values) <= first
        assert len(set(values)) == len(values)
        for value in values:
            assert value
            assert len(value) <= dropped.VALUE_CHARS
            assert "\x00" not in value
            assert any(value in text for text in texts), (kind, value)
    # Bounded: at most `first` values of VALUE_CHARS per kind, JSON-storable.
    size = len(orjson.dumps(ix))
    assert size <= len(KINDS) * (40 + first * (6 * dropped.VALUE_CHARS + 3)) + 30
    # The first N of a longer list are its head.
    longer = index(entries, first=first + 5)
    for kind in KINDS:
        assert longer[kind]["first"][:first] == ix[kind]["first"]
        assert longer[kind]["count"] == ix[kind]["count"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), arguments=st.text(max_size=100), error=st.booleans())
def test_arbitrary_text_and_arguments_never_raise(text: str, arguments: str, error: bool) -> None:
    entries = [
        user(text),
        say(text, call("c1", "bash", arguments), call("c2", "bash", json.dumps({"command": text}))),
        result("c1", text, is_error=error),
        Entry(role="tool", parts=[{"type": "image", "url": "https://i/x.png"}], tool_call_id="c2"),
    ]
    ix = index(entries)
    assert all(ix[k]["count"] >= len(ix[k]["first"]) for k in KINDS)


# --- In the plans -----------------------------------------------------------------------


def test_a_compaction_plan_indexes_what_it_summarizes_and_not_what_it_keeps() -> None:
    history = [
        Entry(role="system", parts=[{"type": "text", "text": "Use tools/system_only.py"}]),
        user("Fix src/dates.py, it raises DateError."),
        say("Looking.", bash("c1", "pytest tests/test_dates.py")),
        result("c1", PYTEST_FAILURE),
        user("Continue if you have next steps."),
        say("Now the kept part.", bash("c2", "cat src/kept_only.py")),
        result("c2", "kept output " * 50),
    ]
    sources = []
    for seq, entry in enumerate(history, start=1):
        entry.tokens = 200
        kind = "continue" if seq == 5 else "message"
        sources.append(engine.Source(seq=seq, kind=kind, entry=entry))
    plan = engine.plan(
        sources, start_seq=1, end_seq=len(history) + 1, keep=400, previous_details=None
    )
    assert plan is not None
    assert plan.first_kept_seq == 6
    # The summarized entries are seqs 2 to 4 (the system prompt is kept, 5 is the
    # service's "continue"): each listed value names the seqs that hold it.
    assert plan.details["dropped"] == index([*plan.history, *plan.turn_prefix], seqs=[2, 3, 4])
    ix = plan.details["dropped"]
    assert ix["commands"]["seqs"] == [[3]]
    assert ix["paths"]["seqs"][0] == [2]
    assert ix["paths"]["first"] == ["src/dates.py", "tests/test_dates.py", "tests/test_x.py"]
    assert ix["commands"]["first"] == ["pytest tests/test_dates.py"]
    assert (
        "FAILED tests/test_x.py::test_y - AssertionError: assert 0 == 1" in (ix["errors"]["first"])
    )
    assert "DateError" in ix["identifiers"]["first"]
    assert "0.05s" in ix["numbers"]["first"]
    # Neither the system prompt (kept), the kept entries, nor the service's "continue".
    seen = json.dumps(ix)
    assert "system_only" not in seen
    assert "kept_only" not in seen
    assert "Continue" not in seen


def test_a_branch_summary_indexes_the_entries_it_summarizes() -> None:
    branch = [
        user("Try the other parser in alt/parser.py"),
        say("", bash("c1", "python alt/parser.py --port 8080")),
        result("c1", "ok"),
    ]
    sources = []
    for seq, entry in enumerate(branch, start=10):
        entry.tokens = 100
        sources.append(engine.Source(seq=seq, kind="message", entry=entry))
    plan = branch_summary.plan(
        sources,
        budget_tokens=250,
        previous_details=None,
        encoding="o200k_base",
        start_seq=10,
        end_seq=13,
    )
    # The budget reads the newest two entries: the index is theirs.
    assert len(plan.history) == 2
    ix = plan.details["dropped"]
    assert ix == index(plan.history)
    assert ix["commands"]["first"] == ["python alt/parser.py --port 8080"]
    assert ix["numbers"]["first"] == ["--port 8080"]
    assert "alt/parser.py" in ix["paths"]["first"]


# --- The shared traces ------------------------------------------------------------------


def trace_entries(path: Path) -> list[Entry]:
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(load(path))]


def _names(path: str, listed_paths: list[str]) -> bool:
    """Whether the index names ``path``: as it is, or the same file relative (the file
    ops resolve a path under a ``cd``; the index lists it as written)."""
    for p in listed_paths:
        p = posixpath.normpath(p)
        if p == path or path.endswith("/" + p) or p.endswith("/" + path):
            return True
    return False


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_the_first_half_names_its_files_commands_and_errors(path: Path) -> None:
    entries = trace_entries(path)
    half = entries[: len(entries) // 2]
    ix = index(half, first=10**6)
    for kind in KINDS:
        assert ix[kind]["count"] == len(ix[kind]["first"])
    # Every value is in the trace as written.
    texts = haystack(half)
    for kind in KINDS:
        for value in ix[kind]["first"]:
            assert any(value in text for text in texts), (kind, value)

    # The files it edits.
    modified = collect(half).modified
    assert modified, "every trace edits files in its first half"
    missing = [f for f in modified if not _names(f, ix["paths"]["first"])]
    assert not missing

    # The commands it runs: each call's first line.
    commands = [c for e in half for part in e.tool_calls() if (c := command_of(part))]
    firsts = [lines[0] for command in commands if (lines := command_lines(command))]
    assert len(firsts) >= 10
    for line in firsts:
        assert line[: dropped.VALUE_CHARS] in ix["commands"]["first"], line

    # The errors it hits: each failed result's error lines, as the anchors tell them
    # (in outputs read whole: every one when nothing was cut).
    _errors_named(half, ix)


def _errors_named(half: list[Entry], ix: dict[str, Any]) -> int:
    """How many error lines of ``half``'s failed results the index names (it must name
    every one it read whole)."""
    commands_by_id = {part["id"]: command_of(part) for e in half for part in e.tool_calls()}
    checked = 0
    for entry in half:
        if entry.role != "tool":
            continue
        output = entry.text()
        if ix["truncated"] and len(output) > dropped.MIN_ENTRY_CHARS:
            continue
        command = commands_by_id.get(entry.tool_call_id or "")
        found = outcome(output, is_error=entry.is_error, command=command)
        for line in found.lines:
            if found.failed and (line.rank != FALLBACK or entry.is_error):
                assert line.text[: dropped.VALUE_CHARS] in ix["errors"]["first"], line.text
                checked += 1
    return checked


def test_traces_errors_are_named_across_the_traces() -> None:
    """Not vacuous: the first halves of the traces hit errors, and the index names them."""
    checked = 0
    for path in trace_files():
        entries = trace_entries(path)
        half = entries[: len(entries) // 2]
        checked += _errors_named(half, index(half, first=10**6))
    assert checked >= 50


# --- Where each value is ------------------------------------------------------------------


def test_each_listed_value_names_the_first_entries_that_hold_it() -> None:
    entries = [
        user("Fix parse_iso_week in src/weeks.py"),  # 10
        say("Running.", bash("c1", "pytest tests/test_weeks.py")),  # 11
        result("c1", "FAILED tests/test_weeks.py::test_parse_iso_week", is_error=True),  # 12
        say("parse_iso_week again", bash("c2", "pytest tests/test_weeks.py")),  # 13
        result("c2", "parse_iso_week ok"),  # 14
        user("parse_iso_week once more"),  # 15
    ]
    seqs = list(range(10, 16))
    ix = index(entries, seqs=seqs)
    for kind in KINDS:
        assert len(ix[kind]["seqs"]) == len(ix[kind]["first"])
    where = {kind: dict(zip(ix[kind]["first"], ix[kind]["seqs"], strict=True)) for kind in KINDS}
    # The first three entries that hold it, each once, in order.
    assert where["identifiers"]["parse_iso_week"] == [10, 13, 14]
    assert where["identifiers"]["test_parse_iso_week"] == [12]
    assert where["paths"]["src/weeks.py"] == [10]
    assert where["commands"]["pytest tests/test_weeks.py"] == [11, 13]
    assert where["errors"]["FAILED tests/test_weeks.py::test_parse_iso_week"] == [12]
    # Without seqs the index is as it was; the values are the same either way.
    plain = index(entries)
    assert all("seqs" not in plain[kind] for kind in KINDS)
    assert {k: ix[k]["first"] for k in KINDS} == {k: plain[k]["first"] for k in KINDS}


def test_first_bounds_the_seqs_too() -> None:
    parsed = [
        user("Look at src/weeks.py"),
        say("Reading.", call("c1", "read_file", {"path": "src/weeks.py"})),
        result("c1", "def parse_iso_week(value): ..."),
    ]
    ix = index(parsed, seqs=[1, 2, 3], first=1)
    # One value a kind, three seqs at most each.
    assert all(len(ix[k]["seqs"]) <= 1 for k in KINDS)
    assert all(len(s) <= dropped.SEQS_PER_VALUE for k in KINDS for s in ix[k]["seqs"])
