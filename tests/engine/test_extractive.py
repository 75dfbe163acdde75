"""The extractive summary, built without a model (app/engine/compaction/extractive.py)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.engine.compaction.anchors import latest_unresolved_error
from app.engine.compaction.extractive import (
    ERROR_CHARS,
    NONE_RECORDED,
    SummaryFacts,
    extractive_summary,
    focus_terms,
    parse_summary,
)
from app.engine.compaction.summary import merge_split_turn, render_context_message, with_file_tags
from app.engine.formats import openai_format
from app.engine.model import Entry
from tests import traces
from tests.engine.test_summary import STRUCTURED_HEADINGS

# The structured prompt's sections: the extractive summary keeps its layout.
HEADINGS = STRUCTURED_HEADINGS
# Below this, the headings themselves no longer fit.
ROOM_FOR_HEADINGS = 700


def text(s: str) -> dict[str, str]:
    return {"type": "text", "text": s}


def user(s: str) -> Entry:
    return Entry(role="user", parts=[text(s)])


def assistant(s: str, *calls: tuple[str, str]) -> Entry:
    parts: list[dict[str, Any]] = [text(s)] if s else []
    for call_id, command in calls:
        parts.append(
            {
                "type": "tool_call",
                "id": call_id,
                "name": "bash",
                "arguments": json.dumps({"command": command}),
            }
        )
    return Entry(role="assistant", parts=parts)


def result(call_id: str, output: str, *, is_error: bool = False) -> Entry:
    return Entry(role="tool", parts=[text(output)], tool_call_id=call_id, is_error=is_error)


def headings(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if re.match(r"#{2,3} ", line)]


def section(summary: str, heading: str) -> str:
    """The body of one section: from its heading to the next one."""
    start = summary.index(f"\n{heading}\n") + len(heading) + 2
    rest = summary[start:]
    m = re.search(r"^#{2,3} ", rest, re.M)
    return (rest[: m.start()] if m else rest).strip()


SESSION = [
    Entry(role="system", parts=[text("You are a coding agent.")]),
    user(
        "Fix the crash in `app/parser.py` when the input is empty.\n"
        "Never touch the migrations. Make sure the tests pass. The weather is nice."
    ),
    assistant("Let me look at the parser.", ("c1", "cat app/parser.py")),
    result("c1", "<returncode>0</returncode>\ndef parse(s):\n    except ValueError:\n        pass"),
    assistant("Let me reproduce it.", ("c2", "python -c 'import app.parser as p; p.parse(\"\")'")),
    result(
        "c2",
        "<returncode>1</returncode>\nTraceback (most recent call last):\n"
        '  File "<string>", line 1, in <module>\n'
        "IndexError: string index out of range",
    ),
    assistant(
        "The issue is that `parse_header` indexes `s[0]` without a check. "
        "I decided to return an empty `Document` instead of raising, because callers expect one.",
        ("c3", "sed -i 's/x/y/' app/parser.py"),
        ("c4", "pytest tests/test_parser.py -q"),
    ),
    result("c3", "<returncode>0</returncode>\n"),
    result("c4", "<returncode>0</returncode>\n3 passed in 0.01s"),
    user("Also add a changelog entry. Don't bump the version."),
    assistant("Next I will add the changelog entry to `CHANGES.md`."),
]


def test_example_session() -> None:
    summary = extractive_summary(
        SESSION,
        previous_summary=None,
        read_files=["app/parser.py", "tests/test_parser.py"],
        modified_files=["app/parser.py"],
    )
    assert headings(summary) == list(HEADINGS)
    goal = section(summary, "## Goal")
    assert goal.startswith(
        "Original request:\n> Fix the crash in `app/parser.py` when the input is empty.\n"
        "> Never touch the migrations."
    )
    assert "Latest requests (newest first):\n> Also add a changelog entry." in goal
    assert section(summary, "## Constraints & Preferences") == (
        "- Don't bump the version.\n- Never touch the migrations.\n- Make sure the tests pass."
    )
    assert section(summary, "### Done") == (
        "- `pytest tests/test_parser.py -q`\n"
        "- `sed -i 's/x/y/' app/parser.py`\n"
        "- `python -c 'import app.parser as p; p.parse(\"\")'` — failed\n"
        "- `cat app/parser.py`"
    )
    assert section(summary, "### In Progress") == (
        "- Next I will add the changelog entry to `CHANGES.md`."
    )
    # The exception, then the traceback's last frame; the exception is unresolved
    # (no later run of that command or of the whole suite), so pinned at the head.
    assert section(summary, "### Blocked") == (
        "- Unresolved: IndexError: string index out of range"
        " — after `python -c 'import app.parser as p; p.parse(\"\")'`\n"
        '- File "<string>", line 1, in <module>'
        " — after `python -c 'import app.parser as p; p.parse(\"\")'`"
    )
    assert "I decided to return an empty `Document` instead of raising" in section(
        summary, "## Key Decisions"
    )
    assert section(summary, "## Files & Artifacts") == (
        "- `app/parser.py` (modified)\n- `tests/test_parser.py` (read)"
    )
    assert section(summary, "## Next Steps") == (
        "- Next I will add the changelog entry to `CHANGES.md`."
    )
    critical = section(summary, "## Critical Context")
    assert critical.startswith(
        "- Latest tool output (after `pytest tests/test_parser.py -q`): 3 passed in 0.01s"
    )
    assert "The issue is that `parse_header` indexes `s[0]` without a check." in critical
    hints = section(summary, "## Lookup Hints").splitlines()
    assert hints[0] == "- `IndexError: string index out of range`"
    assert "- `parse_header`" in hints
    assert "- `CHANGES.md`" in hints


def test_source_code_in_a_successful_output_is_not_an_error() -> None:
    summary = extractive_summary(
        SESSION[:4], previous_summary=None, read_files=[], modified_files=[]
    )
    assert section(summary, "### Blocked") == NONE_RECORDED
    assert "ValueError" not in section(summary, "## Lookup Hints")


def test_tool_errors_without_a_known_pattern_show_their_first_line() -> None:
    entries = [
        user("Deploy the service please"),
        assistant("", ("c1", "deploy --prod")),
        result("c1", "\n<output>\npermission denied for user bob\nmore", is_error=True),
    ]
    summary = extractive_summary(entries, previous_summary=None, read_files=[], modified_files=[])
    assert section(summary, "### Done") == "- `deploy --prod` — failed"
    assert section(summary, "### Blocked") == (
        "- Unresolved: permission denied for user bob — after `deploy --prod`"
    )


def test_other_tools_are_listed_with_their_arguments() -> None:
    entries = [
        user("Read the config file"),
        Entry(
            role="assistant",
            parts=[
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "read_file",
                    "arguments": '{"path": "config.toml", "limit": 20}',
                }
            ],
        ),
        result("c1", "[server]\nport = 80"),
    ]
    summary = extractive_summary(entries, previous_summary=None, read_files=[], modified_files=[])
    assert section(summary, "### Done") == '- `read_file(path="config.toml", limit=20)`'


def test_empty_history_records_nothing() -> None:
    summary = extractive_summary([], previous_summary=None, read_files=[], modified_files=[])
    assert headings(summary) == list(HEADINGS)
    for heading in HEADINGS:
        if heading != "## Progress":
            assert section(summary, heading) == NONE_RECORDED


def test_deterministic() -> None:
    kwargs: dict[str, Any] = {"previous_summary": None, "read_files": ["a"], "modified_files": []}
    assert extractive_summary(SESSION, **kwargs) == extractive_summary(list(SESSION), **kwargs)


def test_windows_newlines_are_quoted_cleanly() -> None:
    summary = extractive_summary(
        [user("line one\r\nline two  \r\n\r\nline four")],
        previous_summary=None,
        read_files=[],
        modified_files=[],
    )
    assert "> line one\n> line two\n>\n> line four\n" in summary


def test_long_first_request_is_clipped_but_its_opening_kept() -> None:
    request = "Please migrate the billing module. " + "x" * 10_000
    summary = extractive_summary(
        [user(request)], previous_summary=None, read_files=[], modified_files=[]
    )
    original = parse_summary(summary).original
    assert original is not None
    assert original.startswith("Please migrate the billing module. xxx")
    assert 1_400 < len(original) < 1_600
    assert "chars clipped" in original


# --- Carrying the previous summary forward ---------------------------------------------


def test_goal_survives_five_successive_compactions() -> None:
    first = "Port the CLI from argparse to click, keeping every flag."
    previous: str | None = None
    for n in range(5):
        chunk = [
            user(first if n == 0 else f"Request number {n}: now handle subcommand {n}."),
            assistant(f"Working on step {n}.", (f"c{n}", f"python step{n}.py")),
            # Odd steps fail; even ones say they went well (an error a script prints
            # fails its output whatever the exit code: anchors' rule 5).
            result(
                f"c{n}",
                f"<returncode>1</returncode>\nValueError: step {n} failed"
                if n % 2
                else f"<returncode>0</returncode>\nstep {n} done",
            ),
        ]
        summary = extractive_summary(
            chunk,
            previous_summary=previous,
            read_files=[f"r{i}.py" for i in range(n + 1)],
            modified_files=[f"m{n}.py"],
        )
        previous = with_file_tags(summary, [f"r{i}.py" for i in range(n + 1)], [f"m{n}.py"])
    assert previous is not None
    facts = parse_summary(previous)
    assert facts.original == first
    assert facts.latest == [
        "Request number 4: now handle subcommand 4.",
        "Request number 3: now handle subcommand 3.",
        "Request number 2: now handle subcommand 2.",
    ]
    assert facts.done[:3] == [
        "`python step4.py`",
        "`python step3.py` — failed",
        "`python step2.py`",
    ]
    assert facts.in_progress == ["Working on step 4."]
    assert "ValueError: step 3 failed — after `python step3.py`" in facts.blocked
    # Files come from the latest (cumulative) lists; older ones carried, never doubled.
    assert facts.files[0] == "`m4.py` (modified)"
    assert len(facts.files) == len({f.split("`")[1] for f in facts.files})
    assert previous.count("<read-files>") == 1
    assert previous.count("## Goal") == 1


def test_carrying_forward_with_nothing_new_changes_nothing() -> None:
    once = extractive_summary(
        SESSION, previous_summary=None, read_files=["a.py"], modified_files=["b.py"]
    )
    again = extractive_summary([], previous_summary=once, read_files=[], modified_files=[])
    assert again == once


def test_a_models_structured_summary_is_carried_forward() -> None:
    llm = (
        "## Goal\nUpgrade the app to Django 5 without downtime.\n\n"
        "## Constraints & Preferences\n- Keep Python 3.11 support\n\n"
        "## Progress\n### Done\n- [x] Bumped `django` in `requirements.txt`\n"
        "### In Progress\n- [ ] Fixing `test_admin`\n### Blocked\n- (none)\n\n"
        "## Key Decisions\n- **Use `django-upgrade`**: it rewrites\n  deprecated imports\n\n"
        "## Next Steps\n1. Run the full suite\n\n"
        "## Critical Context\n(none)\n\n"
        "## Lookup Hints\n- `RemovedInDjango50Warning`"
    )
    stored = with_file_tags(merge_split_turn(llm, "The agent was editing admin.py"), ["a"], ["b"])
    summary = extractive_summary(
        [user("Also drop the old celery tasks.")],
        previous_summary=stored,
        read_files=[],
        modified_files=[],
    )
    facts = parse_summary(summary)
    assert facts.original == "Upgrade the app to Django 5 without downtime."
    assert facts.latest == ["Also drop the old celery tasks."]
    assert facts.constraints == ["Keep Python 3.11 support"]
    assert facts.done == ["[x] Bumped `django` in `requirements.txt`"]
    assert facts.in_progress == ["[ ] Fixing `test_admin`"]
    assert facts.blocked == []
    assert facts.decisions == ["**Use `django-upgrade`**: it rewrites deprecated imports"]
    assert facts.next == ["Run the full suite"]
    assert facts.critical == ["Split turn: The agent was editing admin.py"]
    assert facts.hints == ["`RemovedInDjango50Warning`"]
    assert "<read-files>" not in summary


def test_a_prose_summary_is_kept_as_the_goal() -> None:
    prose = "The user wants the parser rewritten in Rust.\n\nWe ported the lexer."
    summary = extractive_summary(
        [user("Now port the AST.")], previous_summary=prose, read_files=[], modified_files=[]
    )
    facts = parse_summary(summary)
    assert facts.original == prose
    assert facts.latest == ["Now port the AST."]


def test_a_compaction_message_in_the_history_is_the_previous_summary() -> None:
    earlier = extractive_summary(SESSION, previous_summary=None, read_files=[], modified_files=[])
    entries = [user(render_context_message(earlier)), user("Now update the docs.")]
    summary = extractive_summary(entries, previous_summary=None, read_files=[], modified_files=[])
    facts = parse_summary(summary)
    assert facts.original is not None
    assert facts.original.startswith("Fix the crash in `app/parser.py`")
    assert facts.latest[0] == "Now update the docs."
    assert "The conversation history before this point" not in summary


def test_parse_summary_of_nothing() -> None:
    assert parse_summary("") == SummaryFacts()


# --- The size bound -------------------------------------------------------------------

# Words chosen to reach every branch: constraints, errors, headings, quotes, code.
WORDS = st.sampled_from(
    [
        "a",
        "bc",
        " ",
        " ",
        "\n",
        "\n\n",
        ". ",
        "`x_y`",
        "#",
        "## ",
        "> ",
        "- ",
        "_",
        ":",
        "must ",
        "never ",
        "because ",
        "Let me ",
        "ValueError: ",
        "FAILED ",
        "<returncode>1</returncode>",
        "(none)",
        "Original request:",
        "é",
        "\u2028",
        "\r\n",
        "```",
    ]
)
LONG_TEXT = st.one_of(
    st.lists(WORDS, max_size=400).map("".join),
    st.text(max_size=60),
)


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    entries: list[Entry] = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "call"]))
        if kind == "user":
            entries.append(user(draw(LONG_TEXT)))
        elif kind == "assistant":
            entries.append(assistant(draw(LONG_TEXT)))
        else:
            entries.append(assistant(draw(LONG_TEXT), (f"c{i}", draw(LONG_TEXT))))
            entries.append(result(f"c{i}", draw(LONG_TEXT), is_error=draw(st.booleans())))
    return entries


# Error lines that did not read back as written (each found by Hypothesis here): a line
# separator other than a newline inside the quoted line (the line before it ended in
# "- " and lost its space), an error line saying "(none)", the same error pinned twice;
# and two long pinned errors at a small max_chars, once cut where the text reached it
# (an item cut after its list marker or a space lost it when read back).
def two_long_errors(command_chars: int = 150) -> list[Entry]:
    entries: list[Entry] = []
    for k in range(2):
        command = f"pytest tests/test_{k}.py -x " + "y" * command_chars
        entries.append(assistant("", (f"c{k}", command)))
        entries.append(result(f"c{k}", f"ValueError: {k} " + "word - " * 30, is_error=True))
    return entries


DRIFTING = {
    "line separator": (
        [
            assistant("", ("c0", "pytest")),
            result("c0", "ValueError: a - \u2028b", is_error=True),
        ],
        12_000,
    ),
    "reads as none": (
        [assistant("", ("c0", "")), result("c0", "(none)", is_error=True)],
        12_000,
    ),
    "pinned twice": (
        [
            assistant("", ("c1", "")),
            result("c1", "FAILED aaa", is_error=True),
            assistant("", ("c3", "")),
            result("c3", "FAILED aaa", is_error=True),
        ],
        12_000,
    ),
    "pinned errors clipped, not cut": (two_long_errors(), 700),
}


@pytest.mark.parametrize(("entries", "max_chars"), DRIFTING.values(), ids=DRIFTING.keys())
def test_a_summary_carried_forward_into_itself_is_a_fixed_point(
    entries: list[Entry], max_chars: int
) -> None:
    summary = extractive_summary(entries, max_chars=max_chars)
    assert len(summary) <= max_chars
    assert headings(summary) == list(HEADINGS)
    assert "Unresolved:" in summary
    assert all(line == line.rstrip() for line in summary.splitlines())
    again = extractive_summary([], previous_summary=summary, max_chars=max_chars)
    assert again == summary
    assert extractive_summary([], previous_summary=again, max_chars=max_chars) == summary


def test_pinned_errors_are_clipped_last_keeping_their_start_and_command() -> None:
    summary = extractive_summary(two_long_errors(100), max_chars=1_000)
    blocked = section(summary, "### Blocked")
    (newest,) = [line for line in blocked.splitlines() if "ValueError: 1 word" in line]
    assert newest.startswith("- Unresolved: ValueError: 1 word - ")
    assert "…" in newest
    assert newest.endswith(" — after `pytest tests/test_1.py -x " + "y" * 100 + "`")
    # A later history that runs the command again, and passes, resolves it.
    passing = [assistant("", ("c9", "pytest tests/test_1.py -x " + "y" * 100)), result("c9", "ok")]
    later = extractive_summary(passing, previous_summary=summary, max_chars=1_000)
    assert "Unresolved: ValueError: 1 word" not in section(later, "### Blocked")


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(0, 20_000), st.one_of(st.none(), LONG_TEXT))
@example(DRIFTING["line separator"][0], 700, None)
@example(DRIFTING["reads as none"][0], 700, None)
@example(DRIFTING["pinned twice"][0], 700, None)
@example(two_long_errors(), 700, None)
@example(
    [
        assistant("", ("c0", "0")),
        result("c0", "ValueError: a\u2028a"),
    ],
    700,
    None,
)
def test_never_longer_than_max_chars(
    entries: list[Entry], max_chars: int, previous: str | None
) -> None:
    summary = extractive_summary(
        entries,
        previous_summary=previous,
        read_files=[f"src/{i}.py" for i in range(30)],
        modified_files=["src/1.py"],
        max_chars=max_chars,
    )
    assert len(summary) <= max_chars
    if max_chars >= ROOM_FOR_HEADINGS:
        assert headings(summary) == list(HEADINGS)
    # Carried forward into itself, it stays the same: nothing drifts or grows.
    if max_chars >= ROOM_FOR_HEADINGS:
        again = extractive_summary(
            [], previous_summary=summary, read_files=[], modified_files=[], max_chars=max_chars
        )
        assert again == summary


# --- Real traces ----------------------------------------------------------------------


def trace_entries(path: Path) -> list[Entry]:
    return [openai_format.parse_message(m, f"m[{i}]") for i, m in enumerate(traces.load(path))]


def opening(entries: list[Entry]) -> list[str]:
    """The first lines of the first user request, as the summary quotes them."""
    first = next(e for e in entries if e.role == "user").text().replace("\r\n", "\n")
    lines = [line.rstrip() for line in first[:400].splitlines()[:-1]]
    return [f"> {line}" if line else ">" for line in lines]


@pytest.mark.parametrize("path", traces.trace_files(), ids=lambda p: p.name.split(".")[0])
def test_real_trace(path: Path) -> None:
    entries = trace_entries(path)
    summary = extractive_summary(
        entries, previous_summary=None, read_files=["x.py"], modified_files=[]
    )
    assert headings(summary) == list(HEADINGS)
    assert len(summary) <= 12_000
    assert "\n".join(["Original request:", *opening(entries)]) in summary
    assert section(summary, "### Done") != NONE_RECORDED
    assert section(summary, "### In Progress") != NONE_RECORDED
    assert section(summary, "## Files & Artifacts") == "- `x.py` (read)"


@pytest.mark.parametrize("path", traces.trace_files()[::4], ids=lambda p: p.name.split(".")[0])
def test_real_trace_compacted_in_five_steps_keeps_the_first_request(path: Path) -> None:
    entries = trace_entries(path)
    step = len(entries) // 5 + 1
    summary: str | None = None
    for start in range(0, len(entries), step):
        summary = extractive_summary(
            entries[start : start + step],
            previous_summary=summary,
            read_files=[],
            modified_files=[],
            max_chars=8_000,
        )
        assert len(summary) <= 8_000
    assert summary is not None
    assert headings(summary) == list(HEADINGS)
    assert "\n".join(["Original request:", *opening(entries)]) in summary
    # The latest command of the whole trace is the first one listed as done.
    last_call = next(e for e in reversed(entries) if e.tool_calls()).tool_calls()[-1]
    command = json.loads(last_call["arguments"])["command"].strip().splitlines()[0]
    assert section(summary, "### Done").startswith(f"- `{command[:60]}")


# --- Instructions: the focus ----------------------------------------------------------


def long_session(secret_at: int, steps: int = 60) -> list[Entry]:
    """Many tool steps; one early output alone says ``QUUX_LIMIT=17``."""
    entries: list[Entry] = [user("Tidy up the build scripts.")]
    for k in range(steps):
        output = f"<returncode>0</returncode>\nbuilt target {k}\n" + "ok\n" * 20
        if k == secret_at:
            output += "note: QUUX_LIMIT=17 is read from ~/.config/build.ini\n"
        entries += [assistant(f"Step {k}.", (f"c{k}", f"make target{k}")), result(f"c{k}", output)]
    return entries


def test_a_term_named_in_the_instructions_survives_from_an_otherwise_dropped_part() -> None:
    entries = long_session(secret_at=3)
    plain = extractive_summary(entries, max_chars=4_000)
    assert "QUUX_LIMIT" not in plain  # an old, successful output: nothing keeps it
    focused = extractive_summary(
        entries, max_chars=4_000, instructions="Keep what we learned about quux_limit."
    )
    assert len(focused) <= 4_000
    critical = section(focused, "## Critical Context")
    lines = critical.splitlines()
    # The instructions are quoted back as the focus, then the line that names the term.
    assert lines[0] == "- Focus asked for: Keep what we learned about quux_limit."
    assert "QUUX_LIMIT=17 is read from ~/.config/build.ini" in lines[1]
    assert lines[1].startswith("- output of `make target3`: ")
    assert tuple(headings(focused)) == HEADINGS  # the same layout as ever


def test_focus_terms_leave_out_common_words_and_keep_quoted_spans() -> None:
    assert focus_terms('Please focus on the `retry_after` handling and the "rate limit" bug')[
        :2
    ] == ["retry_after", "rate limit"]
    assert "handling" in focus_terms("focus on the handling")
    assert focus_terms("keep it short and please be sure") == ["short"]
    assert focus_terms("") == focus_terms(None) == []
    assert focus_terms("Don't lose the API keys") == ["lose", "keys", "api"]


def test_the_focus_prefers_rare_terms_and_survives_a_small_summary() -> None:
    entries = long_session(secret_at=5)
    # "target" is everywhere; "quux_limit" once: its line comes first.
    focused = extractive_summary(
        entries, max_chars=2_500, instructions="target builds and QUUX_LIMIT"
    )
    assert len(focused) <= 2_500
    critical = section(focused, "## Critical Context").splitlines()
    assert critical[0].startswith("- Focus asked for:")
    assert "QUUX_LIMIT=17" in critical[1]


def test_items_that_name_a_term_come_first_in_each_list() -> None:
    entries = long_session(secret_at=-1)
    focused = extractive_summary(entries, instructions="what happened to target7?")
    done = section(focused, "## Progress\n\n### Done").splitlines()
    assert done[0] == "- `make target7`"


def test_instructions_carry_into_the_next_summary_once() -> None:
    first = extractive_summary(long_session(secret_at=2), instructions="QUUX_LIMIT")
    again = extractive_summary(
        [user("more"), assistant("done")], previous_summary=first, instructions="QUUX_LIMIT"
    )
    assert again.count("Focus asked for: QUUX_LIMIT") == 1
    assert "QUUX_LIMIT=17" in again  # carried forward from the previous summary
    later = extractive_summary([user("more"), assistant("done")], previous_summary=first)
    assert "QUUX_LIMIT=17" in later


def test_no_instructions_no_focus() -> None:
    summary = extractive_summary(SESSION)
    assert "Focus asked for" not in summary
    assert summary == extractive_summary(SESSION, instructions="   ")


# --- The latest unresolved error ------------------------------------------------------

PINNED = "Unresolved:"


def blocked_lines(summary: str) -> list[str]:
    return section(summary, "### Blocked").splitlines()


def failing_session(command: str, output: str, *later: tuple[str, str]) -> list[Entry]:
    entries = [user("Fix the failing import in `app/settings.py`."), assistant("", ("f", command))]
    entries.append(result("f", output))
    for k, (cmd, out) in enumerate(later):
        entries += [assistant(f"Step {k}.", (f"l{k}", cmd)), result(f"l{k}", out)]
    return entries


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (
            "<returncode>1</returncode>\nTraceback (most recent call last):\n"
            '  File "manage.py", line 22, in <module>\n    main()\n'
            "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG",
            "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG",
        ),
        (
            "<returncode>0</returncode>\n=== short test summary info ===\n"
            "FAILED tests/test_settings.py::test_debug - KeyError: 'DEBUG'\n"
            "======= 1 failed, 3 passed in 0.12s =======",
            # The output's last error line is quoted beside the most telling one.
            "FAILED tests/test_settings.py::test_debug - KeyError: 'DEBUG'"
            " · ======= 1 failed, 3 passed in 0.12s =======",
        ),
        ("building\nsomething  broke   here\nExit code: 2", "something  broke   here"),
        ("error: patch failed: app/settings.py:12", "error: patch failed: app/settings.py:12"),
        ("bash: line 1: pytset: command not found", "bash: line 1: pytset: command not found"),
        (
            "thread 'main' panicked at src/main.rs:2:5:",
            "thread 'main' panicked at src/main.rs:2:5:",
        ),
    ],
)
def test_the_latest_unresolved_error_opens_blocked_quoted_exactly(output: str, line: str) -> None:
    command = "cd /app && python -m pytest tests/test_settings.py 2>&1 | tail -20"
    summary = extractive_summary(
        failing_session(command, output, ("ls", "<returncode>0</returncode>"))
    )
    assert blocked_lines(summary)[0] == f"- {PINNED} {line} — after `{command}`"
    assert parse_summary(summary).pinned == [f"{line} — after `{command}`"]


def test_a_resolved_error_is_not_pinned_but_still_listed() -> None:
    fail = "<returncode>1</returncode>\nKeyError: 'DEBUG'"
    ok = "<returncode>0</returncode>\nall good"
    summary = extractive_summary(failing_session("python check.py", fail, ("python check.py", ok)))
    assert blocked_lines(summary) == ["- KeyError: 'DEBUG' — after `python check.py`"]
    assert PINNED not in summary


def test_a_long_error_line_is_clipped_keeping_its_start() -> None:
    line = "pkg.errors.VeryLongProblem: " + "detail " * 100
    summary = extractive_summary(failing_session("python x.py", f"[exit 1]\n{line}"))
    first = blocked_lines(summary)[0]
    clipped = line.strip()[: ERROR_CHARS - 1].rstrip() + "…"
    assert first == f"- {PINNED} {clipped} — after `python x.py`"


def filler(steps: int) -> list[tuple[str, str]]:
    return [
        (
            f"sed -n '{k},{k + 40}p' src/module_{k}.py",
            "<returncode>0</returncode>\n" + "x = 1\n" * 200,
        )
        for k in range(steps)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 40),
    st.integers(1_000, 8_000),
    st.sampled_from(
        [
            "<returncode>1</returncode>\nAssertionError: " + "a" * 400,
            "FAILED tests/t.py::test_x - ValueError: bad",
            "[exit 3]",
            "Hunk #1 FAILED at 12.",
        ]
    ),
)
def test_the_pinned_error_survives_any_cut(steps: int, max_chars: int, output: str) -> None:
    entries = failing_session("python -m pytest tests/t.py", output, *filler(steps))
    entries[0] = user("Fix it. " + "Never break the API. " * 200)  # a long request
    anchor = latest_unresolved_error(entries)
    assert anchor is not None
    summary = extractive_summary(entries, max_chars=max_chars, read_files=["a.py"] * 50)
    assert len(summary) <= max_chars
    pinned = parse_summary(summary).pinned
    assert pinned
    assert pinned[0].startswith(anchor.line[: ERROR_CHARS - 1].rstrip())


def test_a_previous_summarys_unresolved_error_is_carried_until_resolved() -> None:
    fail = "<returncode>1</returncode>\nKeyError: 'DEBUG'"
    ok = "<returncode>0</returncode>\nall good"
    first = extractive_summary(failing_session("python check.py", fail))
    pinned = "KeyError: 'DEBUG' — after `python check.py`"
    assert parse_summary(first).pinned == [pinned]
    # Unrelated work: still unresolved.
    second = extractive_summary(
        [assistant("", ("a", "sed -i 's/x/y/' app/settings.py")), result("a", ok)],
        previous_summary=first,
    )
    assert parse_summary(second).pinned == [pinned]
    # A newer failure comes first; the older stays pinned after it.
    third = extractive_summary(
        [assistant("", ("b", "pytest tests/test_a.py")), result("b", "FAILED tests/test_a.py::t")],
        previous_summary=second,
    )
    assert parse_summary(third).pinned == [
        "FAILED tests/test_a.py::t — after `pytest tests/test_a.py`",
        pinned,
    ]
    # The check runs again and goes well: the older is resolved, listed but not pinned.
    fourth = extractive_summary(
        [assistant("", ("c", "python check.py | tail")), result("c", ok)], previous_summary=third
    )
    assert parse_summary(fourth).pinned == [
        "FAILED tests/test_a.py::t — after `pytest tests/test_a.py`"
    ]
    assert pinned in parse_summary(fourth).blocked
    # The whole suite passes: nothing is pinned any more.
    fifth = extractive_summary(
        [assistant("", ("d", "pytest")), result("d", "===== 9 passed in 1.0s =====")],
        previous_summary=fourth,
    )
    assert parse_summary(fifth).pinned == []
    assert PINNED not in fifth


@pytest.mark.parametrize("path", traces.trace_files(), ids=lambda p: p.name.split(".")[0])
def test_real_trace_keeps_its_latest_unresolved_error_through_compactions(path: Path) -> None:
    """Compacted in six steps at 2,000 characters: after each, the summary holds the
    latest unresolved error of the whole history so far (carried forward)."""
    entries = trace_entries(path)
    cuts = [len(entries) * k // 6 for k in range(7)]
    summary: str | None = None
    for start, end in itertools.pairwise(cuts):
        summary = extractive_summary(entries[start:end], previous_summary=summary, max_chars=2_000)
        assert len(summary) <= 2_000
        anchor = latest_unresolved_error(entries[:end])
        if anchor is not None:
            assert anchor.line[: ERROR_CHARS - 1].rstrip() in summary
