"""The scorecard's facts (docs/eval.md): details an agent may need again, read from a trace
by rules of their own.

Nothing here imports the summarizer's extraction code (``app.engine.compaction.*``):
a measure that shared the summarizer's idea of what matters would share its blind
spots. The error lines and the shell command of a call are read by the continuity
measurement's rules (:mod:`bench.continuity_rules`), which are the measurement's own
too. Each rule is a few regular expressions, checked on hand-written cases in
``tests/bench/test_eval_facts.py``.

A fact has a kind, the message it was first seen in, the strings that show it
(*needles*: any one of them, found in a text, shows the fact) and the query a model
would type to find it again with one search.

- **identifier**: in any message but the system prompt, a word of letters, digits and
  ``_`` that holds ``_`` between two letters or digits (``validate_value``,
  ``WIDGET_SEED``) or is camelCase (a lower-case letter, then an upper-case one:
  ``getTotalIrradiance``, ``DataFrame``; not ``PVSystem``); at least 5
  characters, at most 3 digits, not right after a ``/``, ``-`` or ``$`` and not a file
  name's stem (``test_fields`` of ``test_fields.py``). Shown where it stands as a whole
  word; the query is the identifier.
- **location** (``path:line``): in a tool output or a user message, a file name with
  an extension a source or text file has, then ``:`` and a line number
  (``src/marshmallow/schema.py:628``, pytest's and grep's form), or a traceback
  frame's ``File "…/schema.py", line 628`` (not ``File "<frozen …>"`` or ``<string>``,
  which name no file). Shown by ``schema.py:628`` or
  ``schema.py", line 628``; the query is the location as written (the colon form), or
  the file's name and ``line N`` (the frame's form).
- **number** (numbers from tool outputs): pytest's closing counts (``2 failed, 5
  passed``, the time left out), unittest's ``Ran 12 tests``, and versions: a name and a
  version of three parts or more (``Python 3.9.20``, ``pytest-8.3.3``), or of two
  parts after ``==`` or `` version ``. Shown by the text as written, in any case (pip
  writes ``markupsafe-3.0.3`` as well as ``MarkupSafe-3.0.3``); the query is its words.
- **error** (error lines): every error line of a tool output by
  :func:`bench.continuity_rules.error_lines` (tracebacks' last lines, exception
  lines, pytest's FAILED/ERROR lines, tools' errors, patches that did not apply).
  Shown by its key (:func:`bench.continuity_rules.failure_key`: whitespace runs as
  one space, pytest's ``E`` dropped, the first 80 characters); the query is two or
  three distinctive words of the line (:func:`distinctive_words`).
- **command**: the first line of every shell command an assistant's tool call runs,
  at least 8 characters. Shown by the line's first 80 characters (whitespace runs as
  one space); the query is two or three distinctive words of it, the program it runs
  first when there are fewer than two (``sed fields.py``).

Texts are compared with whitespace runs as one space. A search hit's snippet has its
match marks (``«`` ``»``) taken out first.
"""

from __future__ import annotations

import posixpath
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench import continuity_rules as rules

KINDS = ("identifier", "location", "number", "error", "command")
KIND_LABELS = {
    "identifier": "identifiers",
    "location": "path:line locations",
    "number": "numbers from tool outputs",
    "error": "error lines",
    "command": "commands",
}
KEY_CHARS = rules.KEY_CHARS
COMMAND_MIN_CHARS = 8
IDENTIFIER_MIN_CHARS = 5
QUERY_WORDS = 3


@dataclass(frozen=True, slots=True)
class Fact:
    kind: str
    text: str  # as first seen (for reading a report)
    needles: tuple[str, ...]  # whitespace-normalized; any one shows the fact
    query: str
    index: int  # the trace message it was first seen in

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.needles[0]


# --- the rules ----------------------------------------------------------------------

_IDENT = re.compile(r"(?<![\w/$\\-])[A-Za-z_][A-Za-z0-9_]*(?![\w/-])")
_SNAKE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")
_CAMEL = re.compile(r"[a-z][A-Z]")
_EXTENSIONS = (
    "py|pyx|pyi|pyc|c|h|cc|cpp|hpp|rs|go|java|js|jsx|ts|tsx|rb|php|sh|cfg|toml|ini|txt"
    "|rst|md|json|yml|yaml|xml|html|csv|sql|dcm|log|lock"
)
_STEM = re.compile(rf"\.(?:{_EXTENSIONS})\b")


def identifiers(text: str) -> list[str]:
    """The identifiers of ``text`` by the module's rule, first seen first."""
    out: list[str] = []
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if len(word) < IDENTIFIER_MIN_CHARS or sum(c.isdigit() for c in word) > 3:
            continue
        if not (_SNAKE.search(word) or _CAMEL.search(word)):
            continue
        if _STEM.match(text, match.end()):
            continue
        out.append(word)
    return list(dict.fromkeys(out))


_COLON_LOCATION = re.compile(
    rf"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:{_EXTENSIONS})):(\d+)\b(?!\.\d)"
)
_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')


@dataclass(frozen=True, slots=True)
class Location:
    written: str
    path: str
    line: int
    frame: bool  # a traceback frame's form


def locations(text: str) -> list[Location]:
    """The ``path:line`` locations of ``text`` by the module's rule, in order."""
    found: list[tuple[int, Location]] = []
    for match in _COLON_LOCATION.finditer(text):
        found.append(
            (match.start(), Location(match.group(0), match.group(1), int(match.group(2)), False))
        )
    for match in _FRAME.finditer(text):
        found.append(
            (match.start(), Location(match.group(0), match.group(1), int(match.group(2)), True))
        )
    return [loc for _, loc in sorted(found, key=lambda pair: pair[0])]


_PYTEST_COUNTS = re.compile(
    r"\b\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected)"
    r"(?:, \d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected))*"
)
_RAN = re.compile(r"\bRan \d+ tests?\b")
_VERSION3 = re.compile(
    r"(?<![\w.+-])([A-Za-z][A-Za-z0-9_.+-]*[A-Za-z0-9])(==|-| v| version | )"
    r"(\d+\.\d+\.\d+(?:\.\d+)?(?:(?:\.|-)?(?:dev|rc|post|a|b)\d*)?)(?![\w.])"
)
_VERSION2 = re.compile(
    r"(?<![\w.+-])([A-Za-z][A-Za-z0-9_.+-]*[A-Za-z0-9])(==| version )(\d+\.\d+)(?![\w.])"
)


def numbers(output: str) -> list[str]:
    """The numbers of a tool output by the module's rule, as written, in order."""
    found: list[tuple[int, str]] = []
    for match in _PYTEST_COUNTS.finditer(output):
        line_start = output.rfind("\n", 0, match.start()) + 1
        line_end = output.find("\n", match.end())
        line = output[line_start : line_end if line_end >= 0 else len(output)]
        # pytest's closing line: its counts, then " in 0.12s" (between rules of "=").
        if re.search(r"\bin \d+(?:\.\d+)?s\b", line):
            found.append((match.start(), match.group(0)))
    for pattern in (_RAN,):
        found.extend((m.start(), m.group(0)) for m in pattern.finditer(output))
    for pattern in (_VERSION3, _VERSION2):
        for m in pattern.finditer(output):
            found.append((m.start(), m.group(0)))
    return list(dict.fromkeys(text for _, text in sorted(found)))


_STOP = frozenset(
    [
        "the",
        "a",
        "an",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "by",
        "with",
        "from",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "not",
        "no",
        "yes",
        "if",
        "then",
        "else",
        "do",
        "done",
        "fi",
        "echo",
        "cd",
        "cat",
        "head",
        "tail",
        "grep",
        "sed",
        "awk",
        "ls",
        "find",
        "python",
        "python3",
        "pip",
        "bash",
        "sh",
        "testbed",
        "self",
        "def",
        "return",
        "import",
        "none",
        "true",
        "false",
        "null",
        "line",
        "file",
        "files",
        "error",
        "errors",
        "name",
        "value",
        "type",
        "print",
        "all",
        "any",
        "has",
        "have",
        "had",
        "can",
        "will",
        "would",
        "dev",
        "null",
        "exit",
        "code",
        "status",
        "output",
        "returncode",
        "xargs",
        "sort",
        "uniq",
        "wc",
        "eof",
        "module",
        "named",
        "object",
        "attribute",
        "cannot",
        "takes",
        "given",
        "found",
        "where",
        "include",
    ]
)
_WORD = re.compile(r"[A-Za-z0-9_][\w.:/-]*[A-Za-z0-9_]|[A-Za-z_]")


def _score(word: str) -> int:
    if word.endswith(("Error", "Exception")) or _SNAKE.search(word) or _CAMEL.search(word):
        return 3
    if "." in word or any(c.isdigit() for c in word):
        return 2
    return 1 if len(word) < 7 else 2


def distinctive_words(line: str, count: int = QUERY_WORDS) -> list[str]:
    """Up to ``count`` words of ``line`` a model would type to find it: the most
    distinctive first (an error name, an identifier with ``_`` or camelCase, a word
    with a dot or a digit, a long word; a path by its file name), common words and
    shell programs left out; given in the line's order."""
    words: list[tuple[int, int, str]] = []
    seen: set[str] = set()
    for at, match in enumerate(_WORD.finditer(line)):
        word = match.group(0).rstrip(":.")
        if "/" in word:
            word = posixpath.basename(word.rstrip("/"))
        if len(word) < 3 or word.lower() in _STOP or word in seen or word.startswith("-"):
            continue
        if word.isdigit() or re.fullmatch(r"\d+(?:,\d+)?p", word):  # sed's '10,20p'
            continue
        seen.add(word)
        words.append((-_score(word), at, word))
    best = sorted(words)[:count]
    return [w for _, _, w in sorted(best, key=lambda item: item[1])]


_CD = re.compile(r"^cd\s+\S+\s*(?:&&|;)\s*")


def _program(line: str) -> str | None:
    """The program a command line runs first (after a leading ``cd dir &&``)."""
    words = _CD.sub("", line).split()
    program = posixpath.basename(words[0]) if words else ""
    return program if re.fullmatch(r"[A-Za-z][\w.-]*", program) else None


def _first_line(command: str) -> str:
    return next((line for line in command.splitlines() if line.strip()), "")


def facts_of_message(message: Mapping[str, Any], index: int) -> list[Fact]:
    """The facts one message shows, by the module's rules."""
    role = message.get("role")
    if role in ("system", "developer"):
        return []
    text = rules.message_text(message)
    out: list[Fact] = []
    body = text if role != "assistant" else str(message.get("content") or "")
    for word in identifiers(text):
        out.append(Fact("identifier", word, (word,), word, index))
    if role in ("tool", "user"):
        for loc in locations(body):
            if loc.path.startswith("<"):  # <frozen importlib._bootstrap>, <string>
                continue
            name = posixpath.basename(loc.path)
            needles = (f"{name}:{loc.line}", f'{name}", line {loc.line}')
            query = f"{name} line {loc.line}" if loc.frame else f"{loc.path}:{loc.line}"
            out.append(Fact("location", loc.written, needles, query, index))
    if role == "tool":
        for number in numbers(body):
            out.append(Fact("number", number, (rules.normalize(number),), number, index))
        for _, line in rules.error_lines(body):
            key = rules.failure_key(line)
            words = distinctive_words(line)
            if key and words:
                out.append(Fact("error", line.strip(), (key,), " ".join(words), index))
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            shell = rules.command_of((call.get("function") or {}).get("arguments", ""))
            if shell is None:
                continue
            first = rules.normalize(_first_line(shell))
            words = distinctive_words(first)
            program = _program(first)
            if len(words) < 2 and program and program not in words:
                words = [program, *words]  # "sed fields.py", "cat reproduce_issue.py"
            if len(first) >= COMMAND_MIN_CHARS and words:
                out.append(Fact("command", first, (first[:KEY_CHARS],), " ".join(words), index))
    return out


def trace_facts(messages: Sequence[Mapping[str, Any]]) -> list[Fact]:
    """Every fact of a trace, each once (by kind and first needle), at the message it
    was first seen in."""
    seen: dict[tuple[str, str], Fact] = {}
    for i, message in enumerate(messages):
        for fact in facts_of_message(message, i):
            seen.setdefault(fact.key, fact)
    return list(seen.values())


# --- presence and sampling -------------------------------------------------------------


def _word_in(word: str, text: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text) is not None


def shown(fact: Fact, text: str) -> bool:
    """Whether ``text`` (whitespace-normalized) shows the fact: an identifier as a whole
    word, a number in any case, anything else as a substring."""
    if fact.kind == "identifier":
        return _word_in(fact.needles[0], text)
    if fact.kind == "number":  # pip writes "markupsafe-3.0.3" as well as "MarkupSafe-3.0.3"
        folded = text.casefold()
        return any(needle.casefold() in folded for needle in fact.needles)
    return any(needle in text for needle in fact.needles)


def snippet_text(snippet: str) -> str:
    """A search hit's snippet as text: its match marks out, whitespace runs as one space."""
    return rules.normalize(snippet.replace("«", "").replace("»", ""))


def compacted_away(facts: Iterable[Fact], cut: int, kept_text: str) -> list[Fact]:
    """The facts first seen before message ``cut`` that the messages kept verbatim
    (``kept_text``, whitespace-normalized) do not show: what the compactions so far
    took out of the raw history."""
    return [f for f in facts if f.index < cut and not shown(f, kept_text)]


def sample(facts: Iterable[Fact], per_kind: int, salt: str) -> list[Fact]:
    """Up to ``per_kind`` facts of each kind, picked by a hash of ``salt`` and the fact
    (the same facts for the same salt, whatever the order or the rest of the pool)."""
    by_kind: dict[str, list[tuple[int, Fact]]] = {k: [] for k in KINDS}
    for fact in facts:
        rank = zlib.crc32(f"{salt}\0{fact.kind}\0{fact.needles[0]}".encode())
        by_kind[fact.kind].append((rank, fact))
    out: list[Fact] = []
    for kind in KINDS:
        out.extend(f for _, f in sorted(by_kind[kind], key=lambda p: p[0])[:per_kind])
    return out
