"""The continuity gate (issue 14), pure: what a summary and the kept window must
name (the task's key terms, every modified file, the latest unresolved error),
what is missing, and the block that completes it; the file lists a summary ends
with; the working directory and the anchors a plan carries."""

from __future__ import annotations

import dataclasses
import json
import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.compactions.summarizer import extractive
from app.engine.accounting import tokens
from app.engine.compaction import continuity
from app.engine.compaction import prepare as engine
from app.engine.compaction.continuity import (
    Anchors,
    Completion,
    GateRecord,
    Missing,
    UnresolvedError,
    check,
    complete,
    error_key,
    file_named,
    fit,
    kept_text,
    render_block,
    stated_workdir,
    strip_block,
)
from app.engine.compaction.fileops import FileOps
from app.engine.model import Entry

ERROR = UnresolvedError(
    "django.core.exceptions.ImproperlyConfigured: Requested setting INSTALLED_APPS",
    "python manage.py check",
)


def user(text: str, seq: int = 0) -> Entry:
    entry = Entry(role="user", parts=[{"type": "text", "text": text}], content_form="string")
    entry.tokens = tokens.count_entry(entry)
    return entry


def call(call_id: str, command: str, text: str = "") -> Entry:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.append(
        {
            "type": "tool_call",
            "id": call_id,
            "name": "bash",
            "arguments": json.dumps({"command": command}),
        }
    )
    entry = Entry(role="assistant", parts=parts)
    entry.tokens = tokens.count_entry(entry)
    return entry


def result(call_id: str, output: str) -> Entry:
    entry = Entry(role="tool", parts=[{"type": "text", "text": output}], tool_call_id=call_id)
    entry.tokens = tokens.count_entry(entry)
    return entry


# --- What counts as named ------------------------------------------------------------------


def test_a_term_is_named_as_written_case_sensitive() -> None:
    anchors = Anchors(terms=("parse_date", "ValueError", "src/dates.py"))
    assert check("fixed `parse_date` in src/dates.py", "", anchors).terms == ("ValueError",)
    assert check("PARSE_DATE, valueerror", "", anchors).terms == anchors.terms
    # The kept window counts as much as the summary.
    assert check("", "raise ValueError; parse_date(); src/dates.py", anchors) == Missing()


def test_a_file_is_named_bounded_as_a_path() -> None:
    path = "pydicom/valuerep.py"
    for text in (
        "edited pydicom/valuerep.py.",
        "`pydicom/valuerep.py`: fixed",
        "see ./pydicom/valuerep.py",
        "/testbed/pydicom/valuerep.py:12: error",
        "(pydicom/valuerep.py)",
    ):
        assert file_named(path, text, "/testbed"), text
    for text in (
        "edited src/pydicom/valuerep.py",
        "pydicom/valuerep.pyc",
        "pydicom/valuerep.py.backup",
        "mypydicom/valuerep.py",
        "pydicom/valuerep.py-old",
        "/other/pydicom/valuerep.py",
    ):
        assert not file_named(path, text, "/testbed"), text
    # Without a stated working directory an absolute path is another path.
    assert not file_named(path, "/testbed/pydicom/valuerep.py", None)
    # An absolute path under the working directory is named by its relative form too.
    assert file_named("/testbed/setup.py", "changed setup.py", "/testbed")
    assert not file_named("/testbed/setup.py", "changed setup.py", None)


def test_the_error_is_named_by_its_line_whitespace_aside() -> None:
    anchors = Anchors(error=ERROR)
    assert check("Blocked: " + ERROR.line, "", anchors) == Missing()
    spaced = ERROR.line.replace(" ", "\n   ")
    assert check(spaced, "", anchors) == Missing()
    assert check("ImproperlyConfigured was raised", "", anchors).error == ERROR
    long = UnresolvedError("E   AssertionError: " + "x" * 400)
    key = error_key(long.line)
    assert len(key) == continuity.ERROR_KEY_CHARS
    assert check(f"- {key}…", "", Anchors(error=long)) == Missing()
    assert check(key[:-1], "", Anchors(error=long)).error == long


def test_the_error_is_named_with_the_lines_it_is_quoted_with() -> None:
    """The latest error of a unittest run: its failure line, and the summary it ended on."""
    error = UnresolvedError(
        "ERROR: test_parse (__main__.TestParse.test_parse)",
        "cat <<'EOF' > test_x.py && python test_x.py",
        ("FAILED (errors=1)",),
    )
    anchors = Anchors(error=error)
    assert check("Blocked: " + error.line, "", anchors).error == error
    assert check("FAILED (errors=1)", "", anchors).error == error
    assert check(f"{error.line}\n(then) FAILED  (errors=1)", "", anchors) == Missing()
    shown = (
        "ERROR: test_parse (__main__.TestParse.test_parse) · FAILED (errors=1)"
        " — after `cat <<'EOF' > test_x.py && python test_x.py`"
    )
    assert error.shown() == shown
    block = render_block(Missing(error=error))
    assert f"{continuity.ERROR_LABEL} {shown}" in block
    assert check(block, "", anchors) == Missing()
    # Carried to the next compaction with them; without any, as before.
    assert error.to_details()["also"] == ["FAILED (errors=1)"]
    assert UnresolvedError.from_details(error.to_details()) == error
    assert ERROR.to_details() == {"line": ERROR.line, "command": ERROR.command}
    assert UnresolvedError.from_details({**ERROR.to_details(), "also": [3, " "]}) == ERROR


def test_a_plan_anchors_the_latest_error_of_any_shape() -> None:
    run = "cat <<'EOF' > test_x.py && python test_x.py\nimport unittest\nunittest.main()\nEOF"
    output = (
        "<returncode>1</returncode>\n<output>\nE\n" + "=" * 70 + "\n"
        "ERROR: test_parse (__main__.TestParse.test_parse)\n" + "-" * 70 + "\n"
        'Traceback (most recent call last):\n  File "/testbed/test_x.py", line 9, in test_parse\n'
        "    parse()\nTypeError: parse() missing 1 required positional argument: 'b'\n\n"
        + "-" * 70
        + "\nRan 1 test in 0.001s\n\nFAILED (errors=1)\n</output>"
    )
    history = [user("Fix `parse` in parser.py."), call("c1", run), result("c1", output)]
    later = [user("Go on."), call("c2", "ls"), result("c2", "<returncode>0</returncode>\nsrc")]
    plan = plan_of([*history, *later], keep=5)
    assert plan.anchors.error == UnresolvedError(
        "ERROR: test_parse (__main__.TestParse.test_parse)",
        "cat <<'EOF' > test_x.py && python test_x.py",
        ("FAILED (errors=1)",),
    )
    assert plan.details["unresolved_error"]["also"] == ["FAILED (errors=1)"]
    # Carried to the next compaction, lines and all.
    nxt = plan_of(later, previous_details=plan.details, keep=5)
    assert nxt.anchors.error == plan.anchors.error


def test_the_kept_window_is_read_without_tool_outputs() -> None:
    window = [
        Entry(role="system", parts=[{"type": "text", "text": "You work in /repo."}]),
        call("c1", "sed -i 's/a/b/' src/app.py", "Editing it."),
        result("c1", "ValueError: only in an output"),
    ]
    text = kept_text(window)
    assert "You work in /repo." in text
    assert "sed -i 's/a/b/' src/app.py" in text  # the command, unescaped
    assert "bash" in text
    assert "Editing it." in text
    assert "only in an output" not in text


# --- The block -------------------------------------------------------------------------------


def compose(body: str) -> Any:
    return lambda block: f"{body}\n\n{block}" if block else body


def test_the_block_names_only_what_is_missing_error_first() -> None:
    anchors = Anchors(
        terms=("parse_date", "ISO_WEEK", "`weird` one"),
        files=("src/dates.py", "src/weeks.py"),
        error=ERROR,
    )
    body = "Fixing parse_date in src/dates.py."
    missing = check(body, "", anchors)
    assert missing == Missing(("ISO_WEEK", "`weird` one"), ("src/weeks.py",), ERROR)
    done = complete(compose(body), missing, 10_000)
    assert done.added == missing
    assert done.left == Missing()
    block = render_block(missing)
    assert done.summary == f"{body}\n\n{block}"
    assert block.splitlines() == [
        "<continuity-anchors>",
        continuity.BLOCK_INTRO,
        f"Unresolved error: {ERROR.line} — after `python manage.py check`",
        "Files modified:",
        "src/weeks.py",
        "Task terms to keep: `ISO_WEEK`, `` `weird` one ``",
        "</continuity-anchors>",
    ]
    assert check(done.summary, "", anchors) == Missing()
    assert strip_block(done.summary) == body
    # Nothing missing, nothing added.
    assert complete(compose(body), Missing(), 10_000) == Completion(body)


def test_the_cap_keeps_the_error_then_files_then_terms() -> None:
    terms = tuple(f"term_{i:03d}" for i in range(100))
    files = tuple(f"src/pkg/module_{i:02d}.py" for i in range(10))
    missing = Missing(terms, files, ERROR)
    done = complete(compose("body"), missing, 600)
    block = done.summary.split("\n\n", 1)[1]
    assert len(block) <= 600
    assert done.added.error == ERROR
    assert done.added.files == files
    assert done.added.terms == terms[: len(done.added.terms)]
    assert 0 < len(done.added.terms) < 100
    assert done.left == Missing(terms[len(done.added.terms) :])
    anchors = Anchors(terms, files, ERROR)
    assert check(done.summary, "", anchors) == done.left


@st.composite
def gate_cases(draw: st.DrawFn) -> tuple[str, str, Anchors, int]:
    word = st.text(alphabet=string.ascii_letters + "_.-/`:' ", min_size=2, max_size=24)
    terms = tuple(t.strip() for t in draw(st.lists(word, max_size=12)) if len(t.strip()) >= 2)
    path = st.text(alphabet=string.ascii_lowercase + "_/.", min_size=1, max_size=20).filter(
        lambda p: p.strip("/.") != ""
    )
    files = tuple(dict.fromkeys(draw(st.lists(path, max_size=8))))
    error = draw(
        st.none()
        | st.builds(
            UnresolvedError,
            st.text(min_size=1, max_size=300).filter(lambda s: s.strip() != ""),
            st.text(max_size=40),
        )
    )
    prose = st.text(alphabet=string.printable, max_size=200)
    summary, kept = draw(prose), draw(prose)
    for t in draw(st.lists(st.sampled_from(terms), max_size=4)) if terms else []:
        summary += f" {t} "
    return (
        summary,
        kept,
        Anchors(tuple(dict.fromkeys(terms)), files, error),
        draw(st.integers(0, 3_000)),
    )


@settings(max_examples=300, deadline=None)
@given(gate_cases())
def test_a_completed_summary_passes_the_gate_but_for_what_the_cap_left_out(
    case: tuple[str, str, Anchors, int],
) -> None:
    summary, kept, anchors, cap = case
    missing = check(summary, kept, anchors)
    done = complete(compose(summary), missing, cap)
    # What the block names is named now; only what the cap left out may be missing
    # (an item left out may happen to be named by another one's line).
    after = check(done.summary, kept, anchors)
    assert set(after.terms) <= set(done.left.terms)
    assert set(after.files) <= set(done.left.files)
    assert after.error is None or after.error == done.left.error
    assert (
        check(
            done.summary,
            kept,
            Anchors(done.added.terms, done.added.files, done.added.error, anchors.workdir),
        )
        == Missing()
    )
    assert done.added.count + done.left.count == missing.count
    block = render_block(done.added)
    assert len(block) <= cap
    assert strip_block(done.summary) == summary.strip() or not block
    # With room for everything, nothing is left.
    whole = complete(compose(summary), missing, 10**6)
    assert check(whole.summary, kept, anchors) == Missing()


def test_fit_drops_terms_first_then_files_and_the_error_last() -> None:
    missing = Missing(tuple(f"term_{i}" for i in range(20)), ("a.py", "b.py"), ERROR)
    done = complete(compose("body"), missing, 10_000)
    full = len(done.summary)
    # A budget that fits the error and the files, not the terms.
    no_terms = complete(compose("body"), Missing((), missing.files, ERROR), 10_000).summary
    fitted = fit(compose("body"), done, len(no_terms), len)
    assert fitted.added == Missing((), missing.files, ERROR)
    assert fitted.left == Missing(missing.terms)
    assert len(fitted.summary) <= len(no_terms) < full
    # Too little room for anything: no block at all.
    bare = fit(compose("body"), done, 3, len)
    assert bare.summary == "body"
    assert bare.added == Missing()
    assert bare.left == missing
    # Room enough: unchanged.
    assert fit(compose("body"), done, full, len) == done


def test_refit_records_what_was_trimmed() -> None:
    missing = Missing(("a_b", "c_d"), ("x.py",), None)
    record = GateRecord(Anchors(), missing, completed=missing)
    trimmed = Completion("s", Missing((), ("x.py",)), Missing(("a_b", "c_d")))
    after = record.refit(trimmed, Missing(("c_d",)))
    assert after.completed == Missing((), ("x.py",))
    assert after.trimmed == Missing(("a_b", "c_d"))
    assert after.missing_after == Missing(("c_d",))
    details = after.to_details()
    assert details["trimmed"] == {"terms": ["a_b", "c_d"], "files": [], "error": None}
    assert details["missing_before"]["files"] == ["x.py"]


# --- The file lists -----------------------------------------------------------------------------


def test_modified_files_are_never_dropped_for_read_ones() -> None:
    """At a 16k window an extractive summary is about 2,000 characters: the lists
    used to get 500 of them, and lost modified files to read ones."""
    modified = [f"src/package/module_{i:02d}.py" for i in range(30)]  # ~900 chars
    read = [f"docs/page_{i}.md" for i in range(50)]
    shown_read, shown_modified = engine.capped_files(FileOps.of(read, modified), 2_000)
    assert shown_modified == sorted(modified)
    assert shown_read == ["(and 50 more)"]
    # Room left over goes to the read files.
    few = [f"src/m{i}.py" for i in range(3)]
    shown_read, shown_modified = engine.capped_files(FileOps.of(read, few), 2_000)
    assert shown_modified == few
    assert 10 < len(shown_read) - 1 < 50
    assert shown_read[-1].startswith("(and ")


def test_beyond_its_hard_cap_the_modified_list_is_counted() -> None:
    modified = [f"src/package/module_{i:03d}.py" for i in range(200)]
    _, shown = engine.capped_files(FileOps.of([], modified), 2_000)
    listed = shown[:-1]
    assert sum(len(p) + 1 for p in listed) <= 1_000
    assert shown[-1] == f"(and {200 - len(listed)} more)"
    assert listed == sorted(modified)[: len(listed)]


def test_the_summary_lists_every_modified_file_of_a_small_window() -> None:
    modified = [f"src/package/module_{i:02d}.py" for i in range(30)]
    summary = engine.final_summary("body", None, FileOps.of(["README.md"], modified), 2_000)
    anchors = Anchors(files=tuple(modified))
    assert check(summary, "", anchors) == Missing()


# --- The working directory ------------------------------------------------------------------------


def test_the_working_directory_is_read_where_the_history_states_it() -> None:
    stated = "- MODIFY: Regular source code files in /testbed (this is the working directory)"
    assert stated_workdir(["Fix it.", stated]) == "/testbed"
    assert stated_workdir(["Your cwd is /home/me/project/."]) == "/home/me/project"
    assert stated_workdir(["Fix /testbed/a.py and /srv/b.py."]) is None  # not stated
    assert stated_workdir(["working directory: /a", "working directory: /b"]) is None
    assert stated_workdir(["copy /a to /b in the working directory"]) is None


def plan_of(entries: list[Entry], **kwargs: Any) -> engine.Plan:
    sources = [engine.Source(seq=i + 1, kind="message", entry=e) for i, e in enumerate(entries)]
    plan = engine.plan(
        sources,
        start_seq=1,
        end_seq=len(entries) + 1,
        keep=kwargs.pop("keep", 10),
        previous_details=kwargs.pop("previous_details", None),
        **kwargs,
    )
    assert plan is not None
    return plan


SESSION = [
    Entry(
        role="system",
        parts=[{"type": "text", "text": "The working directory is /testbed."}],
    ),
    user("Fix `parse_date` in src/dates.py; it raises WeekError on ISO weeks."),
    call("c1", "sed -i 's/a/b/' /testbed/src/dates.py"),
    result("c1", "<returncode>0</returncode>"),
    call("c2", "sed -i 's/b/c/' src/dates.py && cat /testbed/README.md README.md"),
    result("c2", "<returncode>0</returncode>"),
    call("c3", "python -m pytest tests/test_dates.py"),
    result(
        "c3",
        "<returncode>1</returncode>\nFAILED tests/test_dates.py::test_week - WeekError: bad",
    ),
    user("Go on."),
    call("c4", "ls"),
    result("c4", "<returncode>0</returncode>\nsrc"),
]


def test_a_plan_dedupes_paths_under_the_stated_working_directory() -> None:
    plan = plan_of(SESSION)
    assert plan.details["working_directory"] == "/testbed"
    assert plan.file_ops.modified == ("src/dates.py",)
    assert plan.file_ops.read == ("README.md",)
    # Not stated: both forms stay.
    unstated = [user("Fix it."), *SESSION[2:]]
    plan = plan_of(unstated)
    assert plan.details["working_directory"] is None
    assert plan.file_ops.modified == ("/testbed/src/dates.py", "src/dates.py")
    # Carried once found.
    carried = plan_of(unstated, previous_details={"working_directory": "/testbed"})
    assert carried.file_ops.modified == ("src/dates.py",)


def test_a_plan_knows_the_anchors_and_carries_them() -> None:
    plan = plan_of(SESSION)
    assert plan.anchors.terms[:3] == ("parse_date", "src/dates.py", "WeekError")
    assert plan.details["task_terms"] == ["parse_date", "src/dates.py", "WeekError"]
    assert plan.anchors.files == ("src/dates.py",)
    assert plan.anchors.error is not None
    assert plan.anchors.error.line == "FAILED tests/test_dates.py::test_week - WeekError: bad"
    assert plan.details["unresolved_error"] == {
        "line": plan.anchors.error.line,
        "command": "python -m pytest tests/test_dates.py",
    }
    # The kept window: from the cut on, and the pinned system prompt before it.
    kept = kept_text(plan.kept)
    assert kept == "The working directory is /testbed.\nbash\nls"
    assert plan.first_kept_seq == 10
    # The next compaction: the first request's terms and the error are carried.
    later = [user("Next."), call("c9", "ls src"), result("c9", "ok"), user("More.")]
    nxt = plan_of(later, previous_details=plan.details, keep=5)
    assert nxt.anchors.terms[:3] == ("parse_date", "src/dates.py", "WeekError")
    assert nxt.anchors.error == plan.anchors.error
    # Until the history runs the check again and it passes.
    fixed = [
        user("Next."),
        call("c9", "python -m pytest tests/test_dates.py"),
        result("c9", "<returncode>0</returncode>\n3 passed"),
        user("More."),
    ]
    assert plan_of(fixed, previous_details=plan.details, keep=5).anchors.error is None


def test_the_first_requests_terms_wait_for_the_first_request() -> None:
    """A compaction that summarizes no request yet carries no terms, so the next one,
    which does, works them out."""
    opening = [
        Entry(role="system", parts=[{"type": "text", "text": "Be brief."}]),
        call("c0", "ls"),
        result("c0", "x" * 4_000),
        user("Fix `parse_date` in src/dates.py."),
    ]
    early = plan_of(opening, keep=20)
    assert early.requests is not None
    assert early.requests.first is None
    assert early.details["task_terms"] is None
    later = plan_of(
        [
            user("Fix `parse_date` in src/dates.py."),
            call("c1", "ls"),
            result("c1", "ok"),
            user("Go."),
        ],
        previous_details=early.details,
        keep=5,
    )
    assert later.details["task_terms"] == ["parse_date", "src/dates.py"]


# --- The extractive summary through the gate --------------------------------------------------------


def long_request() -> str:
    lines = [f"Step {i}: update `handler_{i}` in src/handlers/h{i}.py." for i in range(60)]
    return "Refactor the handlers.\n" + "\n".join(lines)


def test_an_extractive_summary_missing_the_task_is_completed() -> None:
    """A first request far over the requests' budget is clipped in the block, and the
    Goal names it in short: its terms are completed in the block, within its cap."""
    entries = [user(long_request())]
    for k in range(12):
        entries += [call(f"c{k}", f"cat src/x{k}.py"), result(f"c{k}", "x = 1\n" * 300)]
    entries.append(user("Continue with the tests."))
    plan = plan_of(entries, threshold_tokens=3_000, keep=20)
    assert plan.requests is not None
    assert plan.requests.first is not None
    assert plan.requests.first.clipped
    done = extractive(plan, None)
    assert done.gate is not None
    before = done.gate.missing_before
    assert before.terms, "the clipped request lost terms"
    assert done.gate.completed.terms
    assert not done.gate.retried
    assert continuity.TERMS_LABEL in done.summary
    # What the block names is named; the rest is recorded as missing.
    after = check(done.summary, kept_text(plan.kept), plan.anchors)
    assert after == done.gate.missing_after
    assert after.count < before.count


def test_the_block_never_turns_a_committed_compaction_into_one_that_is_not() -> None:
    plan = plan_of(SESSION)
    missing = Missing(tuple(f"some_term_{i:02d}" for i in range(25)), (), None)  # within the cap
    plan = dataclasses.replace(plan, anchors=Anchors(terms=missing.terms))
    draft = engine.Draft("A body.", None, plan)
    base = engine.summary_entry_tokens(draft.render(), plan.encoding)
    # Room for the summary without the block, a "continue", and a few terms.
    tight = dataclasses.replace(plan, replaced_tokens=base + 80)
    summary, record = engine.complete_draft(
        engine.Draft("A body.", None, tight), missing, GateRecord(Anchors(), missing)
    )
    assert engine.summary_entry_tokens(summary, plan.encoding) <= base + 80 - 17
    assert record.trimmed.terms
    assert record.completed.terms
    assert record.trimmed.terms == missing.terms[len(record.completed.terms) :]
    assert record.missing_after == record.trimmed  # nothing else names them
    # A summary too long anyway keeps its block: it is not committed either way.
    hopeless = dataclasses.replace(plan, replaced_tokens=base // 2)
    summary, record = engine.complete_draft(
        engine.Draft("A body.", None, hopeless), missing, GateRecord(Anchors(), missing)
    )
    assert record.trimmed == Missing()
    assert record.completed == missing


def test_after_a_no_gain_commit_the_worker_cuts_the_block_to_what_fits() -> None:
    """The commit counts exactly: when it finds the context would not be smaller,
    the block is cut by what is over (and one token), if the summary without it fits."""
    from app.compactions.pivot import NoGain
    from app.compactions.worker import _fit_gate

    terms = tuple(f"some_term_{i:02d}" for i in range(25))
    plan = dataclasses.replace(plan_of(SESSION), anchors=Anchors(terms=terms))
    done = extractive(plan, None)
    assert done.gate is not None
    assert done.draft is not None
    assert done.gate.completed.terms == terms
    with_block = engine.summary_entry_tokens(done.summary, plan.encoding)
    without = engine.summary_entry_tokens(done.draft.render(), plan.encoding)
    over = (with_block - without) // 2  # half the block must go
    fitted = _fit_gate(done, NoGain(1_000, 1_000 + over), plan.encoding)
    assert fitted is not None
    assert fitted.gate is not None
    assert engine.summary_entry_tokens(fitted.summary, plan.encoding) < with_block - over
    kept, trimmed = fitted.gate.completed.terms, fitted.gate.trimmed.terms
    assert kept
    assert trimmed
    assert kept + trimmed == terms
    assert fitted.gate.missing_after.terms == trimmed
    # The block is not what stands in the way: left as it is (not committed anyway).
    assert _fit_gate(done, NoGain(1_000, 1_000 + with_block), plan.encoding) is None
    # No block: nothing to cut.
    bare = extractive(plan_of(SESSION), None)
    assert bare.gate is not None
    assert bare.gate.completed == Missing()
    assert _fit_gate(bare, NoGain(1_000, 1_010), plan.encoding) is None
