"""The compaction heuristics' catalogues of shapes, as tables (docs/compaction-heuristics.md).

Each catalogue is a tuple of :class:`Shape` rows: a name, a compiled pattern, what a
match yields and examples the pattern must match. The modules that apply them
(:mod:`~app.engine.compaction.anchors`, :mod:`~app.engine.compaction.dropped`) loop over
a table or search one pattern joined from its rows, so a new error shape, exit-code
phrase or number is one row here; tests/engine/test_patterns_corpus.py checks every
row against its examples and a set of texts that must match nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "DIGIT_FIRST",
    "ERROR_LINES",
    "EXIT_CODES",
    "HEX_FIRST",
    "KEYWORDS",
    "NUMBERS",
    "SENTENCES",
    "SIGN_FIRST",
    "TASK_TERMS",
    "UNKEYED",
    "FailureRank",
    "Shape",
    "joined",
]

Y = TypeVar("Y")


@dataclass(frozen=True, slots=True)
class Shape(Generic[Y]):
    """One row of a catalogue: ``pattern`` recognizes the shape named ``name``, a match
    yields ``yields`` (a rank, a kind), and each of ``examples`` must be matched."""

    name: str
    pattern: re.Pattern[str]
    yields: Y
    examples: tuple[str, ...]


def shape(name: str, source: str, yields: Y, *examples: str, flags: int = 0) -> Shape[Y]:
    return Shape(name, re.compile(source, flags), yields, examples)


def joined(rows: Iterable[Shape[Y]], prefix: str = "", flags: int = 0) -> re.Pattern[str]:
    """One pattern that matches what any of ``rows`` matches: their sources (less
    ``prefix``, which they all start with) as alternatives in order, after ``prefix``
    when one is given, so that one search finds the first of them at C speed."""
    body = "|".join(row.pattern.pattern.removeprefix(prefix) for row in rows)
    return re.compile(f"{prefix}(?:{body})" if prefix else body, flags)


# --- Failures: error lines -----------------------------------------------------------------

# Ranks of error lines: the lower, the more it says.
TEST = 0  # a test's own failure line: FAILED tests/x.py::test_y - ...
MESSAGE = 1  # an exception or error message
SUMMARY = 2  # a runner's summary: === 1 failed, 2 passed ===
FRAME = 3  # the traceback's last frame
FALLBACK = 4  # the output's first or last line, when nothing else says what failed


@dataclass(frozen=True, slots=True)
class FailureRank:
    """What an error line yields: its rank, and whether it tells a failure by itself
    (``alone``) or counts only in a result that failed for another reason."""

    rank: int
    alone: bool


_TEST = FailureRank(TEST, alone=True)
_MESSAGE = FailureRank(MESSAGE, alone=True)
_SUMMARY = FailureRank(SUMMARY, alone=True)
_WEAK_MESSAGE = FailureRank(MESSAGE, alone=False)
_WEAK_SUMMARY = FailureRank(SUMMARY, alone=False)

EXCEPTION_NAME = r"(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt|Failure|Fault)"

# Matched against a whole line stripped of its indentation, in this order: the first
# row that matches gives the line's rank (the rows that tell a failure alone first).
ERROR_LINES: tuple[Shape[FailureRank], ...] = (
    # Test runners' failure lines: pytest's short summary and verbose progress,
    # unittest, Go, jest.
    shape(
        "pytest-summary",
        r"^(?:FAILED|ERROR) (?!\()\S+(?: - .*)?$",
        _TEST,
        "FAILED tests/test_x.py::test_y - AssertionError: assert 1 == 2",
        "ERROR tests/test_db.py::test_connect",
    ),
    shape(
        "pytest-progress",
        r"^\S+::\S+ (?:FAILED|ERROR)\b.*$",
        _TEST,
        "tests/test_x.py::test_y FAILED                                [ 50%]",
    ),
    shape(
        "unittest-failure",
        r"^(?:FAIL|ERROR): \w+ \([\w.]+\).*$",
        _TEST,
        "FAIL: test_parse (tests.test_parser.ParserTest)",
        "ERROR: test_load (test_io.LoadTest.test_load)",
    ),
    shape("go-test-failure", r"^--- FAIL: \S+.*$", _TEST, "--- FAIL: TestParse (0.00s)"),
    shape("jest-failure", r"^(?:✕|\u00d7) .+$", _TEST, "✕ adds 1 + 2 (3 ms)", "\u00d7 renders"),
    # Messages.
    shape(
        "pytest-exception",
        r"^E {2,}" + EXCEPTION_NAME + r"\b(?::.*)?$",
        _MESSAGE,
        "E       AssertionError: assert 1 == 2",
        "E   ValueError",
    ),
    shape(
        "compiler-error",
        r"^error(?:\[E\d{4}\])?: .+$",
        _MESSAGE,
        "error[E0308]: mismatched types",
        "error: could not compile `demo` due to previous error",
    ),
    shape(
        "rust-panic",
        r"^thread '[^']*' panicked at.*$",
        _MESSAGE,
        "thread 'main' panicked at 'index out of bounds', src/main.rs:3:5",
    ),
    shape(
        "panic-or-fatal",
        r"^(?:panic|fatal error|fatal): .+$",
        _MESSAGE,
        "panic: runtime error: index out of range [3] with length 2",
        "fatal: not a git repository (or any of the parent directories): .git",
    ),
    shape("npm-error", r"^npm ERR! .+$", _MESSAGE, "npm ERR! code ELIFECYCLE"),
    shape(
        "error-heading",
        r"^(?:collecting \.\.\. )?ERROR: .+$",
        _MESSAGE,
        "ERROR: Could not find a version that satisfies the requirement nopkg",
        "collecting ... ERROR: file or directory not found: tests/test_gone.py",
    ),
    shape(
        "java-thread-exception",
        r"^Exception in thread \S+ .+$",
        _MESSAGE,
        'Exception in thread "main" java.lang.IllegalStateException: closed',
    ),
    shape(
        "located-error",
        r"^[^\s:][^:\n]*:\d+(?::\d+)?: (?:fatal )?error: .+$",
        _MESSAGE,
        "src/app.py:12: error: Incompatible types in assignment",
        "main.c:3:10: fatal error: stdio.hh: No such file or directory",
    ),
    shape(
        "patch-not-applied",
        r"^.*(?:\bpatch failed\b|\bcorrupt patch\b|\bmalformed patch\b|\binvalid patch\b"
        r"|\bpatch does not apply\b|^Hunk #\d+ FAILED\b|can't find file to patch).*$",
        _MESSAGE,
        "Hunk #1 FAILED at 12.",
        "Checking patch src/a.py... patch does not apply",
        "can't find file to patch at input line 3",
        flags=re.I,
    ),
    shape(
        "shell-refused",
        r"^[\w./\[\]-]+: (?:.*: )?(?:command not found|Permission denied)$",
        _MESSAGE,
        "bash: pytset: command not found",
        "/bin/sh: 1: ./run.sh: Permission denied",
    ),
    shape(
        # A shell that could not parse a command line (exit status 2): what follows
        # (``bash: -c: line 1: `the line'``) only echoes the command.
        "shell-syntax-error",
        r"^(?:/(?:usr/)?bin/)?(?:ba|da|z|k)?sh: (?:-c: )?(?:line \d+: |\d+: )?"
        r"(?:syntax error\b.*|Syntax error: .+|unexpected EOF while looking for matching .+)$",
        _MESSAGE,
        "bash: -c: line 1: syntax error near unexpected token `('",
        "bash: -c: line 3: syntax error: unexpected end of file",
        "bash: -c: line 1: unexpected EOF while looking for matching `''",
        '/bin/sh: 1: Syntax error: "(" unexpected',
        "sh: 1: Syntax error: Unterminated quoted string",
    ),
    shape(
        "missing-file",
        r"^[\w./\[\]-]+: .*No such file or directory.*$",
        _MESSAGE,
        "cat: missing.txt: No such file or directory",
    ),
    # Runners' summaries.
    shape(
        "pytest-totals",
        r"^=+ .*\b\d+ (?:failed|errors?)\b.* =+$",
        _SUMMARY,
        "==================== 1 failed, 2 passed in 0.12s ====================",
        "=== 2 errors in 0.30s ===",
    ),
    shape(
        "unittest-totals",
        r"^FAILED \((?:failures|errors|unexpected successes)=\d+.*$",
        _SUMMARY,
        "FAILED (failures=1, errors=2)",
        "FAILED (errors=1)",
        "FAILED (failures=2, errors=1, skipped=3)",
        "FAILED (unexpected successes=1)",
    ),
    shape(
        "cargo-totals",
        r"^test result: FAILED\b.*$",
        _SUMMARY,
        "test result: FAILED. 1 passed; 1 failed; 0 ignored",
    ),
    shape("go-totals", r"^FAIL(?:[ \t]+\S.*)?$", _SUMMARY, "FAIL", "FAIL\texample.com/pkg\t0.01s"),
    shape(
        "jest-totals",
        r"^Tests?: .*\b\d+ failed\b.*$",
        _SUMMARY,
        "Tests:       1 failed, 3 passed, 4 total",
    ),
    # Lines that count only in a result that failed.
    shape(
        "exception",
        r"^(?:Uncaught )?" + EXCEPTION_NAME + r"\b(?::.*)?$",
        _WEAK_MESSAGE,
        "KeyError: 'x'",
        "AssertionError",
        "Uncaught TypeError: x is not a function",
    ),
    shape(
        "dotted-exception",
        r"^(?:[a-z_]\w*\.)+[A-Z]\w*(?:: .*)?$",
        _WEAK_MESSAGE,
        "django.core.exceptions.ImproperlyConfigured: settings are not configured",
    ),
    shape(
        "caused-by",
        r"^Caused by: \S+.*$",
        _WEAK_MESSAGE,
        "Caused by: java.io.IOException: broken pipe",
    ),
    shape(
        "ruff-finding",
        r"^[^\s:]+:\d+:\d+: [A-Z]{1,4}\d{2,4}\b.*$",
        _WEAK_MESSAGE,
        "app/x.py:1:8: F401 [*] `os` imported but unused",
    ),
    shape(
        "missing-or-denied",
        r"^.*\b(?:No such file or directory|Permission denied)\b.*$",
        _WEAK_MESSAGE,
        "Could not open config.yaml (No such file or directory)",
    ),
    shape(
        "checker-totals",
        r"^Found \d+ errors?\b.*$",
        _WEAK_SUMMARY,
        "Found 3 errors in 2 files (checked 10 source files)",
    ),
)

# Every error line holds one of these but the rows named in UNKEYED: an output without
# any is skipped, and only the lines holding one are matched against the rows
# (``str.find`` is fast).
KEYWORDS = (
    "rror", "ERR", "xception", "FAIL", "fail", "Fail", "panic", "fatal", "Exit",
    "Interrupt", "Fault", "✕", "\u00d7", "patch", "Patch", "PATCH", "Hunk", "not found",
    "denied", "No such file", "unexpected EOF",
)  # fmt: skip
UNKEYED = frozenset({"dotted-exception", "ruff-finding"})


# --- Failures: exit codes ------------------------------------------------------------------

# The phrases that report an exit code, each with the code as its one group. A tag wins
# over the phrases; of the phrases, the last one found counts.
EXIT_CODE_FLAGS = re.I | re.M  # the phrases'; a tag is matched as written
EXIT_CODES: tuple[Shape[str], ...] = (
    shape(
        "returncode-tag",
        r"<returncode>\s*(-?\d+)\s*</returncode>",
        "tag",
        "<returncode>1</returncode>",
        "<returncode> -9 </returncode>",
    ),
    shape(
        "exited-with",
        r"^\W{0,3}(?:[\w ]{0,40}? )?(?:exited|failed|terminated|finished|returned) with "
        r"(?:(?:a )?non-?zero )?(?:exit |return )?(?:code|status)[ \t]*[:=]?[ \t]*(-?\d+)"
        r"(?![\d.])[^\n]{0,40}$",
        "phrase",
        "Process exited with code 1",
        "command failed with exit status 2",
        flags=EXIT_CODE_FLAGS,
    ),
    shape(
        "exit-code",
        r"^\W{0,3}(?:exit[ _]?(?:code|status)|return[ _]?code|returncode)[ \t]*[:=]?[ \t]*"
        r"(-?\d+)(?![\d.])[^\n]{0,40}$",
        "phrase",
        "exit code 2",
        "Exit code: 1",
        "exit status 1",
        "return code: 3",
        "[exit code: 1]",
        flags=EXIT_CODE_FLAGS,
    ),
    shape("exit-bracket", r"\[exit:?[ \t]*(-?\d+)\]", "phrase", "[exit 1]", flags=EXIT_CODE_FLAGS),
    shape(
        "returncode-field",
        r"\breturncode=(-?\d+)\b",
        "phrase",
        "CompletedProcess(args=['make'], returncode=2)",
        flags=EXIT_CODE_FLAGS,
    ),
)


# --- What a compaction drops: numbers ------------------------------------------------------

# Each pattern searched starts with one character (a digit; a letter or a sign) and checks
# what comes before it after it: so the search skips, at C speed, what cannot start one.
UNITS = (
    r"ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?"
    r"|[KMGTP]i?B|[kKMGT]b|bytes?|tokens?|chars?|characters"
    r"|%|px|rem|em|[kMG]?Hz|rps|qps"
)
DIGIT_FIRST_PREFIX = r"\d(?<![\w.,:#]\d)"
_SUFFIX = r"(?:(?:a|b|rc|alpha|beta|dev|post|pre)\d{0,4})?"


def _digit_first(name: str, rest: str, *examples: str) -> Shape[str]:
    """A number starting with a digit: the row's pattern is the digit, then ``rest``
    (which reads what follows it) in a group named after the row."""
    return shape(name, DIGIT_FIRST_PREFIX + f"(?P<{name}>{rest})", name, *examples)


# Searched as one pattern (:func:`joined` after :data:`DIGIT_FIRST_PREFIX`): the first
# row that matches at a place gives the kind (the group's name).
DIGIT_FIRST: tuple[Shape[str], ...] = (
    _digit_first(
        "uuid",
        r"(?<!-\d)[0-9a-fA-F]{7}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(?![\w-])",
        "123e4567-e89b-12d3-a456-426614174000",
    ),
    _digit_first("host", r"(?<!-\d)\d{0,2}(?:\.\d{1,3}){3}:\d{2,5}(?![\w.])", "127.0.0.1:8000"),
    _digit_first(
        "version", r"\d{0,5}(?:\.\d{1,6}){2,3}" + _SUFFIX + r"(?![\w.])", "1.24.3", "2.0.0rc1"
    ),
    _digit_first(
        "unit",
        r"\d{0,14}(?:,\d{3}){0,6}(?:\.\d{1,10})?[ \u00a0]?(?:" + UNITS + r")(?:/s)?(?![\w%/])",
        "250 ms",
        "1.5 GB",
        "12,000 tokens",
        "95%",
    ),
    _digit_first("hex", r"(?<!-\d)[0-9a-f]{6,39}(?![\w-])", "3f2a9c1"),
    _digit_first("long", r"(?<!-\d)\d{5,18}(?![\w.,])", "123456"),
    _digit_first("pin", r"\d{0,5}\.\d{1,6}(?![\w.])", "==1.24", "numpy<1.26"),
)

# Searched as one pattern (:func:`joined`); each row is a whole match.
SIGN_FIRST: tuple[Shape[str], ...] = (
    shape(
        "v-version",
        r"v(?<![\w.]v)\d{1,6}(?:\.\d{1,6}){1,3}" + _SUFFIX + r"(?![\w.])",
        "version",
        "v1.2",
        "v2.9.0",
    ),
    shape("localhost", r"l(?<![\w.:-]l)ocalhost:\d{2,5}(?![\w.])", "host", "localhost:8080"),
    shape("loopback", r"\[(?<![\w.:-]\[)::1?\]:\d{2,5}(?![\w.])", "host", "[::1]:5432"),
    shape("port-option", r"-(?<![\w-]-)-port[ =]{1,3}\d{2,5}(?![\w.])", "port", "--port 8080"),
    shape(
        "port-or-pid-upper",
        r"P(?<![\w-]P)(?:ORT[ =:]{1,3}\d{2,5}|ort[ =:]{1,3}\d{2,5}|ID[ =:#]{1,3}\d{1,19})(?![\w.])",
        "id",
        "PORT=5432",
        "Port: 80",
        "PID 4242",
    ),
    shape(
        "port-or-pid",
        r"p(?<![\w-]p)(?:ort[ =:]{1,3}\d{2,5}|id[ =:#]{1,3}\d{1,19})(?![\w.])",
        "id",
        "port 8080",
        "pid 42",
    ),
    shape("id", r"i(?<![\w-]i)d[ =:#]{1,3}\d{1,19}(?![\w.])", "id", "id=17"),
    shape("ID", r"I(?<![\w-]I)D[ =:#]{1,3}\d{1,19}(?![\w.])", "id", "ID: 99"),
    shape("issue", r"#(?<![\w#&]#)\d{1,9}(?!\w)", "id", "#123"),
)

# A number starting with a letter of a hex digit: a git hash or a UUID.
HEX_FIRST = shape(
    "hex-letter",
    r"[a-fA-F](?<![\w-][a-fA-F])"
    r"(?:(?P<uuid>[0-9a-fA-F]{7}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})|(?P<hex>[0-9a-f]{6,39}))"
    r"(?![\w-])",
    "id",
    "e3b0c44",
    "f47ac10b-58cc-4372-a567-0e02b2c3d479",
)
NUMBERS: tuple[Shape[str], ...] = (*DIGIT_FIRST, *SIGN_FIRST, HEX_FIRST)


# --- Task terms ----------------------------------------------------------------------------

# Searched as one pattern (:func:`joined`): the first row that matches at a place gives the
# term, its group named after the row (a ``word`` is kept only when it looks like an
# identifier or a path).
TASK_TERMS: tuple[Shape[str], ...] = (
    shape("tick", r"`(?P<tick>[^`\n]{2,120})`", "quoted", "`make check`"),
    shape("dq", r"\"(?P<dq>[^\"\n]{3,120})\"", "quoted", '"connection refused"'),
    shape("cq", r"\u201c(?P<cq>[^\u201d\n]{3,120})\u201d", "quoted", "\u201cdry run\u201d"),
    shape("sq", r"(?<![\w'])'(?P<sq>[^'\n]{3,120})'(?![\w'])", "quoted", "'utf-8'"),
    shape("url", r"(?P<url>https?://[^\s<>()\[\]`'\"]+)", "url", "https://example.com/docs"),
    shape("opt", r"(?P<opt>(?<![\w-])--[A-Za-z][\w-]+)", "option", "--dry-run"),
    shape("issue", r"(?P<issue>(?<![\w&])#\d{2,})", "number", "#42"),
    shape(
        "version",
        r"(?P<version>(?<![\w.])(?:v\d+(?:\.\d+){1,3}|\d+(?:\.\d+){2,3})(?:[a-z]+\d*)?(?![\w.]))",
        "number",
        "v1.2",
        "3.11.4",
    ),
    shape(
        "number",
        r"(?P<number>(?<![\w.])\d+(?:\.\d+)?[ \u00a0]?"
        r"(?:ms|µs|ns|s|sec|min|h|KB|MB|GB|TB|KiB|MiB|GiB|kb|mb|gb|px|em|rem|%|k|M)(?![\w]))",
        "number",
        "250ms",
        "2 GB",
    ),
    shape(
        "word",
        r"(?P<word>(?:[A-Za-z_~/.][\w~/.:-]*[\w/])|(?:[A-Za-z_]\w*))",
        "identifier",
        "parse_config",
        "src/app/main.py",
        "HTTPServer",
        "os.path.join",
        ".gitignore",
        "pkg::module",
    ),
)


# --- The extractive summary: sentences worth quoting ---------------------------------------

# Searched in lowercased text (the sources are lowercase): a sentence holding a match is
# quoted in the section the row yields; user's sentences for constraints, the agent's
# for the others.
SENTENCES: tuple[Shape[str], ...] = (
    shape(
        "constraint",
        r"\b(?:must|never|don['\u2019]?t|do not|always|only|avoid|prefer|make sure"
        r"|should not|shouldn['\u2019]?t)\b",
        "constraints",
        "you must keep the public api unchanged.",
        "don't touch the migrations.",
        "avoid new dependencies.",
    ),
    shape(
        "decision",
        r"decid|instead|because|will use|chose|approach",
        "decisions",
        "i decided to patch the parser rather than the lexer.",
        "we will use a lock instead.",
    ),
    shape(
        "finding",
        r"\b(?:root cause|the (?:issue|problem|bug|error|cause) (?:is|was|seems|appears|occurs"
        r"|happens|lies)|is caused by|turns out|i found|found that|i see that|i can see that"
        r"|the fix (?:is|was|should))\b",
        "critical",
        "the root cause is a stale cache.",
        "it turns out the fixture leaks.",
    ),
    shape(
        "intent",
        r"\b(?:next|let me|let's|i'll|i will|i need to|need to|we need|going to|todo)\b",
        "next",
        "let me run the tests again.",
        "next, update the changelog.",
    ),
)
