"""What a compaction must not make the agent forget: its latest unresolved failure, and
the distinctive terms of its task. Pure: entries and text in, plain values out; the
extractive summarizer and the continuity checks share these rules.

The rules are specified in docs/compaction-heuristics.md, "Failures, unresolved errors
and task terms": when a tool result failed (an error flag, a non-zero exit code, a
telling error line, a tool's ``Error:``, a program's printed exception), which of its
lines say what went wrong and in what order, when a later result resolves a failure
(the same command, the same check, the same tool on the same file), and what a task
term is. The shapes of error lines, exit-code phrases and task terms they recognize are
the tables of :mod:`app.engine.compaction.patterns`.
"""

from __future__ import annotations

import bisect
import heapq
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.engine.compaction import patterns
from app.engine.compaction.patterns import (
    ERROR_LINES,
    FALLBACK,
    FRAME,
    MESSAGE,
    SUMMARY,
    TEST,
)
from app.engine.compaction.shell import program_argv, simple_commands
from app.engine.model import Entry, Part

__all__ = [
    "FALLBACK",
    "FRAME",
    "MESSAGE",
    "SUMMARY",
    "TEST",
    "ErrorAnchor",
    "ErrorLine",
    "Outcome",
    "clip_keeping_anchors",
    "error_line_kind",
    "exit_code",
    "failures",
    "is_resolved",
    "is_superseded",
    "latest_unresolved_error",
    "outcome",
    "task_terms",
    "unresolved_errors",
]

SCAN_CHARS = 16_000  # how much of an output's end is searched for error lines
EDGE_CHARS = 300  # where an exit code is looked for, from either end
MAX_LINES = 4  # error lines kept per failure
LABEL_CHARS = 160


@dataclass(frozen=True, slots=True)
class ErrorLine:
    """One line of an output that says what went wrong, stripped of its indentation."""

    text: str
    rank: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a tool result went: ``failed``, its exit code if it says one, and the
    lines that say what went wrong, most telling first."""

    failed: bool
    exit_code: int | None = None
    lines: tuple[ErrorLine, ...] = ()
    ran_no_tests: bool = False
    # The error line written last (what the output ended on: a runner's summary after
    # a test's failure line, the exception closing a traceback), and where a syntax
    # error is (``File "x.py", line 12``): what a pinned error quotes beside its line.
    last: str | None = None
    where: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorAnchor:
    """A failed tool result: the line that says what went wrong, exactly as written
    (stripped of its indentation), and where it comes from."""

    line: str
    lines: tuple[str, ...]  # every error line found, most telling first (``line`` first)
    # What else the latest error is quoted with: the output's last error line when it is
    # not ``line`` (``FAILED (errors=1)`` after ``ERROR: test_x (m.T)``), and where a
    # syntax error is (its line number changes from one run to the next).
    also: tuple[str, ...]
    command: str | None  # the shell command, or the tool and its arguments
    label: str  # the command on one short line: the part that ran the failing check
    tool: str | None  # the tool's name
    index: int  # the tool result's position in the entries given
    tool_call_id: str | None
    exit_code: int | None


# --- Exit codes ----------------------------------------------------------------------

# The catalogue's rows (:data:`app.engine.compaction.patterns.EXIT_CODES`), each kind
# searched as one pattern whose one non-empty group is the code.
_RETURNCODE_TAG = patterns.joined(row for row in patterns.EXIT_CODES if row.yields == "tag")
_EXIT_PHRASE = patterns.joined(
    (row for row in patterns.EXIT_CODES if row.yields == "phrase"), flags=patterns.EXIT_CODE_FLAGS
)


def _code(m: re.Match[str]) -> int:
    return int(next(g for g in m.groups() if g is not None))


def exit_code(text: str) -> int | None:
    """The exit code ``text`` reports near its start or end, if it says one: a
    ``<returncode>`` tag first, else the last phrase of the end, else of the start."""
    head, tail = text[:EDGE_CHARS], text[-EDGE_CHARS:]
    for part in (head, tail):
        if m := _RETURNCODE_TAG.search(part):
            return _code(m)
    for part in (tail, head):
        found = list(_EXIT_PHRASE.finditer(part))
        if found:
            return _code(found[-1])
    return None


# --- Error lines ---------------------------------------------------------------------

# The catalogue's rows (:data:`app.engine.compaction.patterns.ERROR_LINES`) as tried:
# those that tell a failure alone first, each as (match, rank, alone).
_Row = tuple[Callable[[str], re.Match[str] | None], int, bool]
_ORDERED = sorted(ERROR_LINES, key=lambda row: not row.yields.alone)
_ROWS: tuple[_Row, ...] = tuple((r.pattern.match, r.yields.rank, r.yields.alone) for r in _ORDERED)
# The rows tried on a line that holds none of the keywords.
_UNKEYED_ROWS: tuple[_Row, ...] = tuple(
    (r.pattern.match, r.yields.rank, r.yields.alone) for r in _ORDERED if r.name in patterns.UNKEYED
)
_TRACEBACK = "Traceback (most recent call last):"
# A Python syntax error (its traceback, when it has one, ends at the line it could not
# parse, not in a function), and pytest's prefix of the lines it quotes.
_SYNTAX_ERROR = re.compile(
    r"^(?:E\s+)?(?:[A-Za-z_]\w*\.)*(?:SyntaxError|IndentationError|TabError)\b"
)
_PYTEST_QUOTE = re.compile(r"^E(?:\s+|$)")
LOCATION_LINES = 5  # how far above a syntax error its ``File "x", line N`` is looked for
_FRAME = re.compile(r'^File "[^"\n]+", line \d+(?:, in .+)?$')
_PYTEST_FRAME = re.compile(r"^[^\s:]+\.py:\d+: \w+$")
_EXCEPTION_CLOSING = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")
# Rule 5: what a program prints when something went wrong, at the start of a line.
_PRINTED_ERROR = re.compile(
    r"^(?:" + patterns.EXCEPTION_NAME + r"|(?:[a-z_]\w*\.)+[A-Z]\w*|[ \t]+Error): "
    r"(?!(?:[-+]?[\d.,]+(?:[eE][-+]?\d+)?%?|None|null|nil|false|False|-)?\s*$)\S.*$",
    re.M,
)
_TAG_LINE = re.compile(r"^\s*</?[A-Za-z_][\w-]*>(?:[^<>\n]{0,20}</[A-Za-z_][\w-]*>)?\s*$")
_TOOL_ERROR_START = re.compile(r"^(?:Error|error|ERROR)\b\s*[:!-]")
_NO_TESTS = re.compile(r"^=+ (?:no tests ran|.*\b0 items\b).*=+$|^collected 0 items\b", re.M)
# Nothing found, not a failure: exit 1 of the last command of a pipeline.
_QUIET_ONE = frozenset(
    {"grep", "egrep", "fgrep", "rg", "ag", "ack", "diff", "cmp", "test", "[", "[["}
)
_KEYWORDS = patterns.KEYWORDS


def _has_keyword(text: str) -> bool:
    return any(word in text for word in _KEYWORDS)


def error_line_kind(line: str, *, failed: bool = True) -> int | None:
    """The rank of ``line`` as an error line, or None if it is not one; with
    ``failed`` False only the lines that tell a failure by themselves count."""
    text = line.strip()
    if not text:
        return None
    for match, rank, alone in _ROWS if _has_keyword(text) else _UNKEYED_ROWS:
        if (alone or failed) and match(text):
            return rank
    return None


def _traceback_lines(text: str) -> list[tuple[int, ErrorLine]]:
    """The exception line closing the last traceback of ``text`` and its last frame,
    each with the position of its line."""
    start = text.rfind(_TRACEBACK)
    line_start = text.rfind("\n", 0, start) + 1
    indent = start - line_start
    found: list[tuple[int, ErrorLine]] = []
    last_frame: tuple[int, str] | None = None
    pos = text.find("\n", start)
    while 0 <= pos < len(text):
        begin = pos + 1
        pos = text.find("\n", begin)
        line = text[begin : pos if pos >= 0 else len(text)]
        stripped = line.strip()
        if not stripped:
            continue
        if _FRAME.match(stripped):
            last_frame = (begin, stripped)
            continue
        if len(line) - len(line.lstrip()) > indent or last_frame is None:
            continue  # a frame's code or its ^^^^ markers, or output printed in between
        if _EXCEPTION_CLOSING.match(stripped):
            found.append((begin, ErrorLine(stripped, MESSAGE)))
            found.append((last_frame[0], ErrorLine(last_frame[1], FRAME)))
            break
        # Not an exception (``--`` between grep's matches, ``...``): look further.
    return found


def _sort_key(position: int, line: ErrorLine, frame_of: int | None) -> tuple[int, int]:
    """Most telling first, then the later line; a traceback's last frame right after
    its exception (of all the lines, it says where the failure happened)."""
    if frame_of is not None:
        return MESSAGE, -(2 * frame_of)
    return line.rank, -(2 * position + 1)


@dataclass(frozen=True, slots=True)
class _Scanned:
    lines: list[ErrorLine]
    last: str | None = None
    where: str | None = None


def _location(tail: str, start: int) -> tuple[int, str] | None:
    """Where the syntax error whose line starts at ``start`` is: the ``File "x", line N``
    line printed above it (its code and caret between), pytest's ``E`` prefix left out;
    and where that line starts."""
    end = start
    for _ in range(LOCATION_LINES):
        if end <= 0:
            break
        begin = tail.rfind("\n", 0, end - 1) + 1
        line = _PYTEST_QUOTE.sub("", tail[begin : end - 1].strip(), count=1).strip()
        if _FRAME.match(line):
            return begin, line
        end = begin
    return None


def _scan(text: str, failed: bool) -> _Scanned:
    """The error lines of ``text``'s end, most telling first (docs/compaction-heuristics.md),
    the one written last, and a syntax error's location.

    Looking for the telling lines only (``failed`` False, the common case), just the
    lines that hold one of :data:`_KEYWORDS` are matched, found with ``str.find``."""
    tail = _tail(text)
    found: list[tuple[int, ErrorLine]] = []
    keys: list[tuple[int, int]] = []
    frame_of: dict[int, str] = {}  # an exception's position: its traceback's last frame
    if _TRACEBACK in tail:
        found = _traceback_lines(tail)
        if found:
            (exception, message), (frame, closing) = found
            # The exception that ended the run comes before the messages the program
            # printed (its buffered output may follow the traceback), its frame next.
            ended = len(tail) + 1
            keys = [_sort_key(ended, message, None), _sort_key(frame, closing, ended)]
            frame_of[exception] = closing.text
    taken = {p for p, _ in found}
    for start in _line_starts(tail) if failed else _keyword_line_starts(tail):
        if start in taken:
            continue
        end = tail.find("\n", start)
        line = tail[start : end if end >= 0 else len(tail)].strip()
        rank = error_line_kind(line, failed=failed)
        if rank is None and failed and _PYTEST_FRAME.match(line):
            rank = FRAME
        if rank is not None:
            found.append((start, ErrorLine(line, rank)))
            keys.append(_sort_key(start, found[-1][1], None))
    # A syntax error printed without a traceback: where it is, right after it.
    syntax = [(p, e) for p, e in found if e.rank == MESSAGE and _SYNTAX_ERROR.match(e.text)]
    at = max(syntax, key=lambda f: f[0])[0] if syntax else None
    if at is not None and at not in frame_of and (location := _location(tail, at)) is not None:
        frame_of[at] = location[1]
        found.append((location[0], ErrorLine(location[1], FRAME)))
        keys.append(_sort_key(location[0], found[-1][1], at))
    ranked = sorted(zip(keys, found, strict=True), key=lambda f: f[0])
    out: list[ErrorLine] = []
    seen: set[str] = set()
    for _, (_, error) in ranked:
        if error.text not in seen:
            seen.add(error.text)
            out.append(error)
        if len(out) >= MAX_LINES:
            break
    if not out:
        return _Scanned(out)
    said = [(p, e) for p, e in found if e.rank <= SUMMARY]
    last = max(said, key=lambda f: f[0]) if said else None
    first = ranked[0][1]
    where = next(
        (
            frame_of[p]
            for p, e in (first, last or first)
            if p in frame_of and _SYNTAX_ERROR.match(e.text)
        ),
        None,
    )
    return _Scanned(out, last[1].text if last is not None else None, where)


def _tail(text: str) -> str:
    """The end of ``text`` searched for error lines: :data:`SCAN_CHARS`, whole lines."""
    tail = text[-SCAN_CHARS:]
    if len(text) > SCAN_CHARS:
        tail = tail[tail.find("\n") + 1 :]  # cut mid-line
    return tail


def _line_starts(text: str) -> list[int]:
    starts = [0]
    pos = text.find("\n")
    while pos >= 0:
        starts.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return starts


def _keyword_line_starts(text: str) -> list[int]:
    """Where the lines that hold a keyword start, in order."""
    starts: set[int] = set()
    for word in _KEYWORDS:
        pos = text.find(word)
        while pos >= 0:
            starts.add(text.rfind("\n", 0, pos) + 1)
            end = text.find("\n", pos)
            if end < 0:
                break
            pos = text.find(word, end)
    return sorted(starts)


def _content_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not _TAG_LINE.match(ln)]


def outcome(text: str, *, is_error: bool = False, command: str | None = None) -> Outcome:
    """How a tool result whose output is ``text`` went (docs/compaction-heuristics.md).
    ``command`` is the shell command that produced it, if any."""
    code = exit_code(text)
    telling = _scan(text, failed=False).lines
    nonzero = code not in (None, 0) and not (code == 1 and _quiet_on_one(command))
    if is_error or nonzero:
        scanned = _scan(text, failed=True)
        lines = scanned.lines
        if not lines:
            content = _content_lines(text[:SCAN_CHARS] if is_error else text[-SCAN_CHARS:])
            said = [ln for ln in content if not _EXIT_PHRASE.fullmatch(ln)]
            if said:  # a tool says what went wrong first, a command last
                lines = [ErrorLine(said[0] if is_error else said[-1], FALLBACK)]
            elif m := (_RETURNCODE_TAG.search(text) or _EXIT_PHRASE.search(text)):
                lines = [ErrorLine(m[0].strip(), FALLBACK)]
            elif tags := [ln.strip() for ln in text.splitlines() if ln.strip()]:
                # Nothing but tags (``<error/>``): still what the result said.
                lines = [ErrorLine(tags[0] if is_error else tags[-1], FALLBACK)]
        return _failed(code, scanned, lines)
    if telling:
        return _failed(code, _scan(text, failed=True))
    if code is None:
        content = _content_lines(text[:2_000])
        if content and _TOOL_ERROR_START.match(content[0]):
            return Outcome(True, None, (ErrorLine(content[0], MESSAGE),))
    if command is not None and _PRINTED_ERROR.search(_tail(text)) and _runs(command):
        return _failed(code, _scan(text, failed=True))
    return Outcome(False, code, (), ran_no_tests=_NO_TESTS.search(text[-SCAN_CHARS:]) is not None)


def _failed(code: int | None, scanned: _Scanned, lines: list[ErrorLine] | None = None) -> Outcome:
    return Outcome(
        True,
        code,
        tuple(scanned.lines if lines is None else lines),
        False,
        scanned.last,
        scanned.where,
    )


def _runs(command: str) -> bool:
    """Whether ``command`` ran something, rather than only looked around (rule 5)."""
    return bool(command.strip()) and not _shell_checks(command).lookup


def _quiet_on_one(command: str | None) -> bool:
    if not command:
        return False
    stages = [program_argv(c.argv) for c in simple_commands(command)]
    stages = [s for s in stages if s]
    return bool(stages) and posixpath.basename(stages[-1][0]) in _QUIET_ONE


# --- What a command checks -----------------------------------------------------------

_LOOKUPS = frozenset(
    {
        "ls", "cat", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg", "ag",
        "ack", "find", "fd", "locate", "which", "whereis", "type", "file", "stat", "wc",
        "pwd", "echo", "printf", "tree", "du", "df", "env", "printenv", "cd", "sed", "awk",
        "nl", "sort", "uniq", "cut", "tr", "diff", "cmp", "xargs", "true", "realpath",
        "dirname", "basename", "readlink", "id", "whoami", "uname", "date",
    }
)  # fmt: skip
_GIT_LOOKUPS = frozenset(
    {"log", "show", "diff", "status", "blame", "grep", "branch", "ls-files", "rev-parse"}
)
_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)*)?|pypy\d*")
_RUNNERS = frozenset(
    {
        "pytest", "py.test", "mypy", "ruff", "flake8", "pylint", "pyright", "black",
        "isort", "tox", "nox", "jest", "vitest", "mocha", "tsc", "eslint",
    }
)  # fmt: skip
# Options of the runners that take the next word as their value.
_VALUED = frozenset(
    {
        "-k", "-m", "-p", "-c", "-o", "-W", "-n", "-r", "--deselect", "--ignore", "--tb",
        "--maxfail", "--rootdir", "--config-file", "--durations", "--junitxml", "--basetemp",
        "--cov", "--select", "--ignore-glob", "-e", "--env", "-t", "--testNamePattern",
        "--run", "-run", "--config", "--python-version", "--exclude",
    }
)  # fmt: skip
_NARROWING = frozenset(
    {"-k", "-m", "-t", "--testNamePattern", "-run", "--run", "--lf", "--deselect"}
)
_SUBCOMMANDS = frozenset({"check", "format", "test", "run", "vet", "build"})


@dataclass(frozen=True, slots=True)
class _Test:
    runner: str
    target: str  # "" for the whole suite
    narrowed: str  # the -k expression (or the like) that narrowed it, "" if none


@dataclass(frozen=True, slots=True)
class _Checks:
    """What a call checks, for telling when a later call settles its failure."""

    keys: frozenset[str]
    tests: tuple[_Test, ...] = ()
    lookup: bool = False


def _shell_checks(command: str) -> _Checks:
    commands = list(simple_commands(command))
    keys: set[str] = set()
    tests: list[_Test] = []
    lookup = bool(commands)
    firsts: list[str] = []
    for c in commands:
        argv = program_argv(c.argv)
        if c.writes or (c.stdin is not None and not c.piped):
            lookup = False
        if not argv:
            continue
        program = posixpath.basename(argv[0])
        if not c.piped:
            firsts.append(" ".join(argv))
        if program == "git":
            sub = next((a for a in argv[1:] if not a.startswith("-")), "")
            lookup = lookup and sub in _GIT_LOOKUPS
        elif program == "sed":
            lookup = lookup and not any(a.startswith(("-i", "--in-place")) for a in argv[1:])
        elif program not in _LOOKUPS:
            lookup = False
        if c.piped:
            continue
        tests += _tests(program, argv[1:])
        if script := _script(program, argv):
            keys.add("script:" + script)
    if firsts:
        keys.add("cmd:" + " ; ".join(firsts))
    return _Checks(frozenset(keys), tuple(tests), lookup)


def _script(program: str, argv: Sequence[str]) -> str | None:
    """The file a command runs as a script (``python x.py``, ``bash x.sh``, ``./x.sh``)."""
    if "/" in argv[0] and posixpath.splitext(argv[0])[1]:
        return posixpath.basename(argv[0])
    if not (_PYTHON.fullmatch(program) or program in ("bash", "sh", "node", "ruby", "perl")):
        return None
    for arg in argv[1:]:
        if arg in ("-c", "-m", "-e"):
            return None
        if not arg.startswith("-"):
            return posixpath.basename(arg) if posixpath.splitext(arg)[1] else None
    return None


def _tests(program: str, args: Sequence[str]) -> list[_Test]:
    runner = program
    if _PYTHON.fullmatch(program):
        if "-m" not in args[:-1]:
            return []
        k = list(args).index("-m")
        runner, args = args[k + 1], args[k + 2 :]
        if runner == "py.test":
            runner = "pytest"
    elif program in ("go", "cargo") and args[:1] == ["test"]:
        runner, args = f"{program} test", args[1:]
    elif program in ("npm", "yarn", "pnpm", "make") and args and args[0] in ("test", "check"):
        return [_Test(f"{program} {args[0]}", "", " ".join(args[1:]))]
    elif program in ("npx", "uvx") and args:
        return _tests(posixpath.basename(args[0]), args[1:])
    if runner not in _RUNNERS and runner not in ("unittest", "go test", "cargo test"):
        return []
    args = list(args)
    if runner in ("ruff", "unittest") and args[:1] and args[0] in _SUBCOMMANDS | {"discover"}:
        args = args[1:]
    targets: list[str] = []
    narrowed: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name = arg.split("=", 1)[0]
        valued = name in _VALUED and "=" not in arg
        value = args[i] if valued and i < len(args) else ""
        if name in _NARROWING:
            narrowed.append(f"{name} {value}".strip() if valued else arg)
        if arg.startswith("-"):
            i += valued
            continue
        if runner == "go test" and arg in ("./...", "..."):
            continue  # every package: the whole suite
        targets.append(_target(arg))
    narrow = " ".join(narrowed)
    return [_Test(runner, t, narrow) for t in targets] or [_Test(runner, "", narrow)]


def _target(word: str) -> str:
    path, sep, rest = word.partition("::")
    path = posixpath.normpath(path) if path else path
    return path + sep + rest


def _covers(done: _Test, failed: _Test) -> bool:
    """Whether a successful run ``done`` ran the failed test ``failed`` again."""
    if done.runner != failed.runner or (done.narrowed and done.narrowed != failed.narrowed):
        return False
    if done.target in ("", "."):
        return True
    target = done.target.rstrip("/")
    return failed.target == target or failed.target.startswith(
        (target + "::", target + "/", target + ".")
    )


_PATH_KEYS = ("path", "file_path", "filePath", "file", "filename", "target_file")


def _tool_checks(name: str, arguments: str) -> _Checks:
    try:
        args: Any = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        args = None
    if isinstance(args, dict):
        path = next((v for k in _PATH_KEYS if isinstance(v := args.get(k), str)), None)
        action = args.get("command") if isinstance(args.get("command"), str) else ""
        if path is not None:
            return _Checks(frozenset({f"tool:{name}:{action}:{path}"}))
    return _Checks(frozenset({f"tool:{name}:{arguments}"}))


@dataclass(slots=True)
class _Call:
    name: str | None
    arguments: str
    command: str | None  # the shell command its arguments carry, if any
    _checks: _Checks | None = None

    @property
    def checks(self) -> _Checks:
        if self._checks is None:
            if self.command is not None:
                self._checks = _shell_checks(self.command)
            else:
                self._checks = _tool_checks(self.name or "", self.arguments)
        return self._checks

    def describe(self) -> str:
        if self.command is not None:
            return self.command
        return f"{self.name or 'tool'}({self.arguments[:LABEL_CHARS]})"

    def label(self) -> str:
        if self.command is None:
            return _clip(self.describe(), LABEL_CHARS)
        lines = [ln.strip() for ln in self.command.splitlines() if ln.strip()]
        if not lines:
            return ""
        # The line that ran a check (``python x.py`` after a here-document), else the first.
        chosen = lines[0]
        if len(lines) > 1:
            for line in reversed(lines):
                checks = _shell_checks(line)
                if checks.tests or any(k.startswith("script:") for k in checks.keys):
                    chosen = line
                    break
        return _clip(chosen, LABEL_CHARS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


_EDITORS = frozenset({"str_replace_based_edit_tool", "str_replace_editor", "text_editor"})


def command_of(part: Part) -> str | None:
    """The shell command a tool call's arguments carry (``command``, ``cmd`` or
    ``script``; an argv list is joined with spaces); never an editor's ``command``
    (``view``, ``str_replace``, ...)."""
    name = part.get("name")
    if isinstance(name, str) and name.lower().rsplit("__", 1)[-1] in _EDITORS:
        return None
    raw = part.get("arguments") or ""
    try:
        args: Any = orjson.loads(raw) if isinstance(raw, str) and raw.strip() else None
    except orjson.JSONDecodeError:
        return None
    if isinstance(args, dict):
        for name in ("command", "cmd", "script"):
            value = args.get(name)
            if isinstance(value, str) and value.strip():
                return value
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                return " ".join(value)
    return None


def _calls(entries: Sequence[Entry]) -> dict[str, _Call]:
    calls: dict[str, _Call] = {}
    for entry in entries:
        if entry.role == "assistant":
            for part in entry.parts:
                if part.get("type") == "tool_call" and isinstance(part.get("id"), str):
                    arguments = part.get("arguments")
                    calls[part["id"]] = _Call(
                        part.get("name"),
                        arguments if isinstance(arguments, str) else "",
                        command_of(part),
                    )
    return calls


# --- Failures, newest first ----------------------------------------------------------


@dataclass(slots=True)
class _Resolver:
    """What the results read so far (the later ones) settled."""

    keys: set[str] = field(default_factory=set)
    tests: list[_Test] = field(default_factory=list)
    any_success: bool = False

    def add(self, checks: _Checks, result: Outcome) -> None:
        if result.ran_no_tests and checks.tests:
            return  # a run that ran nothing settles nothing
        self.any_success = True
        self.keys |= checks.keys
        self.tests += checks.tests

    def settles(self, checks: _Checks) -> bool:
        if checks.lookup and self.any_success:
            return True
        if checks.keys & self.keys:
            return True
        return any(_covers(done, failed) for failed in checks.tests for done in self.tests)


Outcomes = dict[int, Outcome]  # by the ``id`` of the tool result's entry


def _results(
    entries: Sequence[Entry], calls: Mapping[str, _Call], cache: Outcomes | None
) -> Iterator[tuple[int, Entry, _Call | None, Outcome]]:
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.role != "tool":
            continue
        call = calls.get(entry.tool_call_id or "")
        result = cache.get(id(entry)) if cache is not None else None
        if result is None:
            command = call.command if call is not None else None
            result = outcome(entry.text(), is_error=entry.is_error, command=command)
            if cache is not None:
                cache[id(entry)] = result
        yield index, entry, call, result


def _anchor(index: int, entry: Entry, call: _Call | None, result: Outcome) -> ErrorAnchor:
    lines = tuple(line.text for line in result.lines)
    line = lines[0] if lines else ""
    also = tuple(
        dict.fromkeys(x for x in (result.last, result.where) if x and x.strip() and x != line)
    )
    return ErrorAnchor(
        line=line,
        lines=lines,
        also=also,
        command=call.describe() if call is not None else None,
        label=call.label() if call is not None else "",
        tool=call.name if call is not None else entry.tool_name,
        index=index,
        tool_call_id=entry.tool_call_id,
        exit_code=result.exit_code,
    )


def iter_failures(entries: Sequence[Entry], cache: Outcomes | None = None) -> Iterator[ErrorAnchor]:
    """The failed tool results of ``entries``, newest first, lazily. ``cache`` keeps
    the outcomes worked out, for a caller that asks again about the same entries."""
    calls = _calls(entries)
    for index, entry, call, result in _results(entries, calls, cache):
        if result.failed:
            yield _anchor(index, entry, call, result)


def failures(entries: Sequence[Entry], limit: int | None = None) -> list[ErrorAnchor]:
    """The failed tool results of ``entries``, newest first (at most ``limit``)."""
    out: list[ErrorAnchor] = []
    for anchor in iter_failures(entries):
        out.append(anchor)
        if limit is not None and len(out) >= limit:
            break
    return out


def unresolved_errors(
    entries: Sequence[Entry], limit: int = 1, cache: Outcomes | None = None
) -> list[ErrorAnchor]:
    """The failures of ``entries`` that no later result resolves
    (docs/compaction-heuristics.md), newest first, at most ``limit``. Reads from the newest result back and
    stops there; ``cache`` as for :func:`iter_failures`."""
    calls = _calls(entries)
    resolver = _Resolver()
    found: list[ErrorAnchor] = []
    failed_again: set[str] = set()  # the checks that failed later
    for index, entry, call, result in _results(entries, calls, cache):
        checks = call.checks if call is not None else _Checks(frozenset())
        if not result.failed:
            resolver.add(checks, result)
        elif not resolver.settles(checks) and not checks.keys & failed_again:
            found.append(_anchor(index, entry, call, result))
            if len(found) >= limit:
                break
        if result.failed:
            failed_again |= checks.keys
    return found


def latest_unresolved_error(
    entries: Sequence[Entry], cache: Outcomes | None = None
) -> ErrorAnchor | None:
    """The newest failure of ``entries`` that no later result resolves
    (docs/compaction-heuristics.md), or None."""
    found = unresolved_errors(entries, 1, cache)
    return found[0] if found else None


def is_resolved(command: str, entries: Sequence[Entry], cache: Outcomes | None = None) -> bool:
    """Whether a failure of the shell ``command`` (run before ``entries``) is resolved
    by a result in ``entries``: a previous summary's unresolved error, carried forward."""
    checks = _shell_checks(command)
    calls = _calls(entries)
    resolver = _Resolver()
    for _, _, call, result in _results(entries, calls, cache):
        if not result.failed:
            resolver.add(call.checks if call is not None else _Checks(frozenset()), result)
    return resolver.settles(checks)


def is_superseded(command: str, entries: Sequence[Entry], cache: Outcomes | None = None) -> bool:
    """Whether a failure of the shell ``command`` (run before ``entries``) is no longer the
    latest word on its check: a result in ``entries`` resolves it, or the same command
    or script failed again (that newer failure is the one to keep)."""
    checks = _shell_checks(command)
    if checks.keys and any(
        call is not None and result.failed and call.checks.keys & checks.keys
        for _, _, call, result in _results(entries, _calls(entries), cache)
    ):
        return True
    return is_resolved(command, entries, cache)


# --- Task terms ----------------------------------------------------------------------

_TERM = patterns.joined(patterns.TASK_TERMS)
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z]{2,}[a-z]{2,}")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "a.m", "p.m", "vs", "n/a", "and/or"})


def _word_is_term(word: str) -> bool:
    if word.lower() in _ABBREVIATIONS or sum(c.isalpha() for c in word) < 2:
        return False
    if "_" in word and any(c.isalpha() for c in word.replace("_", "")):
        return True
    if "::" in word or "/" in word:
        return any(c.isalpha() for c in word)
    if word.startswith("."):
        return len(word) > 2 and word[1:].replace("-", "").isalnum()  # .gitignore
    if "." in word:
        return len(word) >= 4 and all(word.split("."))
    return _CAMEL.search(word) is not None


def task_terms(text: str) -> list[str]:
    """The distinctive terms of a request (docs/compaction-heuristics.md), each once, in
    the order they first appear."""
    terms: list[str] = []
    for m in _TERM.finditer(text):
        kind = m.lastgroup
        value = m[kind] if kind is not None else None
        if value is None:
            continue
        value = value.strip()
        if kind == "word":
            value = value.rstrip(".:/") if not value.endswith("::") else value
            if not _word_is_term(value):
                continue
        elif kind == "url":
            value = value.rstrip(".,;:")
        if len(value) >= 2:
            terms.append(value)
    return list(dict.fromkeys(terms))


def _omitted(n: int) -> str:
    return f"[... {n} lines omitted ...]"


def clip_keeping_anchors(text: str, max_chars: int) -> str:
    """``text`` if it fits in ``max_chars``, else whole lines of it that do, in their
    order, each run of left-out lines marked ``[... N lines omitted ...]``.

    The lines are chosen in three rounds: the first line (the request's opening) and
    the error lines, earlier first; then the lines that name task terms or paths, the
    most terms not yet kept per character first (a line that adds no new term and no
    path is skipped), so that a few long code lines early in a request do not crowd out
    the identifiers of its end; then the other lines from the head and the tail inwards.
    A line too long to fit is left out; when no line fits, the text's head is cut to
    size instead. The second round is a lazy greedy choice (a line's worth only falls
    as others are kept), so a long text costs O(n log n), not O(n²)."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 0:
        return ""
    lines = text.split("\n")
    n = len(lines)
    # A pasted log of megabytes: only its head and tail are read for anchors (the
    # lines between are left out), so the work stays bounded whatever the text.
    head, tail = _analysed(lines)
    looked_at = lines[:head] + lines[tail:]
    some_terms = [
        frozenset(task_terms(line)) if line.strip() else frozenset() for line in looked_at
    ]
    terms = some_terms[:head] + [frozenset()] * (tail - head) + some_terms[head:]
    some_priorities = _line_priorities(looked_at, some_terms)
    priority = some_priorities[:head] + [UNREAD] * (tail - head) + some_priorities[head:]
    kept: list[int] = []
    # The output's length is its items' (lines and markers) plus a break between two;
    # counted here as a break after each item, less one. Nothing kept: one marker.
    size = _gap_size(n) - 1

    def keep(k: int) -> bool:
        nonlocal size
        pos = bisect.bisect_left(kept, k)
        before = kept[pos - 1] if pos > 0 else -1
        after = kept[pos] if pos < len(kept) else n
        old_gap = _gap_size(after - before - 1)
        new_gaps = _gap_size(k - before - 1) + _gap_size(after - k - 1)
        delta = len(lines[k]) + 1 + new_gaps - old_gap
        if size + delta > max_chars:
            return False
        size += delta
        kept.insert(pos, k)
        return True

    covered: set[str] = set()
    for k in range(n):
        if priority[k] <= 1 and keep(k):
            covered |= terms[k]
    heap = [(-_density(len(terms[k]), lines[k]), k) for k in range(n) if priority[k] in (2, 3)]
    heapq.heapify(heap)
    while heap:
        _, k = heapq.heappop(heap)
        gain = len(terms[k] - covered)
        density = _density(gain, lines[k])
        if heap and density < -heap[0][0]:
            heapq.heappush(heap, (-density, k))  # worth less now: its turn comes later
            continue
        if (gain or priority[k] == 2) and keep(k):
            covered |= terms[k]
    middle = (n - 1) / 2
    rest = sorted(
        (k for k in range(n) if priority[k] == 4), key=lambda k: (abs(k - middle) * -1, k)
    )
    for k in rest:
        keep(k)
    if not kept:
        return text[: max_chars - 1].rstrip() + "…"
    out: list[str] = []
    previous = -1
    for k in kept:
        if k - previous > 1:
            out.append(_omitted(k - previous - 1))
        out.append(lines[k])
        previous = k
    if n - 1 - previous > 0:
        out.append(_omitted(n - 1 - previous))
    return "\n".join(out)


# Lines the clipping reads for anchors, at most: this many characters from the head,
# as many from the tail; the lines between are never kept (priority UNREAD).
ANALYSED_CHARS = 100_000
UNREAD = 5


def _analysed(lines: Sequence[str]) -> tuple[int, int]:
    """The head ``lines[:head]`` and the tail ``lines[tail:]`` that are read for anchors,
    each within ANALYSED_CHARS (at least one line each)."""
    head, size = 0, 0
    while head < len(lines) and (head == 0 or size + len(lines[head]) <= ANALYSED_CHARS):
        size += len(lines[head]) + 1
        head += 1
    tail, size = len(lines), 0
    while tail > head and (tail == len(lines) or size + len(lines[tail - 1]) <= ANALYSED_CHARS):
        size += len(lines[tail - 1]) + 1
        tail -= 1
    return head, tail


def _density(new_terms: int, line: str) -> float:
    """What keeping ``line`` is worth: the task terms it adds per character."""
    return new_terms / (len(line) + 8)


def _gap_size(n: int) -> int:
    """What ``n`` left-out lines cost: their marker and its line break."""
    return len(_omitted(n)) + 1 if n > 0 else 0


_PATHISH = re.compile(r"(?:^|[\s`'\"(])(?:[\w.~-]+/)+[\w.-]+|\b[\w-]+\.[A-Za-z]{1,5}\b")


def _line_priorities(
    lines: Sequence[str], line_terms: Sequence[frozenset[str]] | None = None
) -> list[int]:
    """0 the opening line, 1 an error line, 2 a line naming a term first or a path,
    3 another line naming a term, 4 the rest. ``line_terms``: each line's task terms,
    when the caller has them already."""
    seen: set[str] = set()
    out: list[int] = []
    opened = False
    in_traceback = False
    for index, line in enumerate(lines):
        stripped = line.strip()
        terms = (
            line_terms[index] if line_terms is not None else task_terms(line) if stripped else []
        )
        if not opened and stripped:
            out.append(0)
            opened = True
            seen.update(terms)
            continue
        if stripped == _TRACEBACK:
            in_traceback = True
        new = [t for t in terms if t not in seen]
        seen.update(terms)
        rank = error_line_kind(line, failed=in_traceback)
        if rank is not None and rank <= SUMMARY:
            out.append(1)
        elif new or _PATHISH.search(line):
            out.append(2)
        elif terms:
            out.append(3)
        else:
            out.append(4)
    return out
