"""What a compaction drops: an index of the specifics the entries it summarizes held
(paths, commands, errors, identifiers, numbers, URLs), so that a user or an agent can
see what left the context.

The rules are specified in docs/compaction-heuristics.md, "What a compaction drops":
what each kind counts, how values are written and cut, and how reading is bounded
(:data:`TOTAL_CHARS` in all, :data:`ENTRY_CHARS` of an entry, linear patterns). The
shapes of numbers are the tables of :mod:`app.engine.compaction.patterns`. Pure and
deterministic: the same entries give the same index.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.engine.compaction import patterns
from app.engine.compaction.anchors import FALLBACK, command_of, outcome
from app.engine.compaction.fileops import PATH_KEYS, FileOps, collect
from app.engine.compaction.shell import program_argv, simple_commands
from app.engine.model import Entry

__all__ = ["FIRST", "KINDS", "command_lines", "index"]

KINDS = ("paths", "commands", "errors", "identifiers", "numbers", "urls")
FIRST = 20  # values listed per kind
VALUE_CHARS = 200  # a longer value is cut to its head
ENTRY_CHARS = 16_000  # read of one entry at most: its head and its end
MIN_ENTRY_CHARS = 2_000  # read of each entry however long the history
TOTAL_CHARS = 300_000  # read of all the entries at most
TOKEN_CHARS = 300  # a longer token is neither a path nor an identifier
COMMAND_CHARS = 8_000  # of one command, what is split into lines
MAX_STRINGS = 200  # string values read of one tool call's arguments
SEQS_PER_VALUE = 3  # seqs of the entries that hold a listed value, at most


# --- Paths and identifiers ----------------------------------------------------------------

# A word: a run of anything but whitespace and these.
_SEP = r"\s\"'`()<>\[\]{},;|=\\"
# The words that may be a path or an identifier, found at C speed: those holding ``/``,
# ``.``, ``_`` or ``:``, or a capital after their first character, and the usual file
# names (``Makefile``). Each is tried once, from its first character (the lookbehind),
# and each alternative reads it to its end and back at most: linear.
_WORD = re.compile(
    rf"(?<![^{_SEP}])(?:[^{_SEP}]*[/._:][^{_SEP}]*|[^{_SEP}]+[A-Z][^{_SEP}]*"
    r"|(?:Makefile|Dockerfile|Containerfile|Jenkinsfile|Procfile|Gemfile|Rakefile"
    rf"|Pipfile|Vagrantfile)(?![^{_SEP}]))"
)
_ALPHA = re.compile(r"[^\W\d_]")
_PATHISH = re.compile(r"[\w.~+@%/-]+")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w{0,99}(?:\.[A-Za-z_]\w{0,99}){0,15}")
_SCOPED = re.compile(r"[A-Za-z_]\w{0,99}(?:::[A-Za-z_]\w{0,99}){1,15}")
# Searched for: [A-Z]{2}[a-z]{2} is found where [A-Z]{2,}[a-z]{2,} would be (HTTPServer).
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]{2}")
_LEFT_STRIP = "*:;,!?@&$#"
_RIGHT_STRIP = ".,:;!?*"

# Extensions that name a file by themselves (``parser.py``); others only after a
# directory (``src/x.in``), since ``obj.attr`` looks the same.
_FILE_EXTENSIONS = frozenset(
    {
        "py", "pyi", "pyx", "ipynb", "js", "mjs", "cjs", "jsx", "ts", "tsx", "json",
        "jsonl", "yaml", "yml", "toml", "ini", "cfg", "md", "rst", "txt", "csv", "tsv",
        "xml", "html", "htm", "css", "scss", "sql", "sh", "bash", "zsh", "go", "rs", "c",
        "h", "cc", "cpp", "cxx", "hpp", "java", "kt", "scala", "swift", "rb", "php", "lua",
        "dart", "vue", "svelte", "proto", "graphql", "tf", "gradle", "svg", "png", "jpg",
        "jpeg", "gif", "pdf", "zip", "gz", "tgz", "whl", "sqlite", "sqlite3", "parquet",
        "npy", "npz", "h5", "dcm", "log",
    }
)  # fmt: skip
_FILE_NAMES = frozenset(
    {
        "Makefile", "Dockerfile", "Containerfile", "Jenkinsfile", "Procfile", "Gemfile",
        "Rakefile", "Pipfile", "Vagrantfile", "README", "LICENSE", "CHANGELOG", "AUTHORS",
        "CODEOWNERS", "go.mod", "go.sum", "Cargo.lock", "poetry.lock", "uv.lock",
        "yarn.lock", "Gemfile.lock", "Pipfile.lock", "MANIFEST.in", "requirements.in",
    }
)  # fmt: skip
# Dotfiles by name (``.index`` is an attribute); also ``.xrc``, ``.xignore`` and
# ``.x.yml``.
_DOTFILES = frozenset(
    {
        "git", "github", "gitattributes", "gitmodules", "env", "venv", "vscode", "idea",
        "editorconfig", "flake8", "profile", "bash_profile", "python-version",
        "tool-versions", "devcontainer", "circleci", "husky", "cargo", "config", "ssh",
    }
)  # fmt: skip
# ``self.json``, ``np.log``: attributes, not files.
_NOT_STEMS = frozenset(
    {
        "self", "cls", "this", "np", "pd", "os", "sys", "math", "r", "re", "json", "resp",
        "response", "request", "req", "args", "kwargs", "obj", "ctx", "mock", "logging",
        "logger", "data", "result", "res",
    }
)  # fmt: skip
_ABBREVIATIONS = frozenset({"e.g", "i.e", "a.m", "p.m", "u.s", "n.b", "cf", "vs", "etc"})
_HOST_ENDINGS = frozenset({"com", "org", "net", "io", "dev", "ai", "edu", "gov", "co", "uk"})


def _extension(name: str) -> str:
    stem, dot, ext = name.rpartition(".")
    return ext if dot and stem and stem != "." else ""


def _is_path(word: str, *, called: bool) -> bool:
    """Whether ``word`` looks like a path; ``called`` when a ``(`` follows it."""
    if len(word) < 3 or not _PATHISH.fullmatch(word) or not _ALPHA.search(word):
        return False
    if "/" in word:
        if word.startswith(("s/", "y/")) and word.count("/") >= 3:
            return False  # a sed expression: s/old/new/g
        if word.startswith(("/", "./", "../", "~/")):
            return word.strip("/.~") != ""
        parts = word.split("/")
        last = parts[-1] or (parts[-2] if len(parts) > 1 else "")
        ext = _extension(last)
        if ext and ext.isalnum() and any(c.isalpha() for c in ext) and len(ext) <= 10:
            return True
        return word.count("/") >= 2 and all(parts[:-1])
    if word in _FILE_NAMES:
        return True
    if word.startswith("."):
        rest = word[1:].lower()
        return (
            rest in _DOTFILES
            or rest.endswith(("rc", "ignore"))
            or (_extension(rest).lower() in _FILE_EXTENSIONS and rest[:1].isalpha())
        )
    ext = _extension(word)
    if called or ext.lower() not in _FILE_EXTENSIONS:
        return False
    stem = word[: -len(ext) - 1]
    return stem.split(".")[-1].lower() not in _NOT_STEMS and not stem.isdigit()


def _is_identifier(word: str) -> bool:
    if len(word) < 3:
        return False
    if "::" in word:
        return _SCOPED.fullmatch(word) is not None
    if not _IDENTIFIER.fullmatch(word):
        return False
    if "." in word:
        parts = word.split(".")
        return (
            word.lower() not in _ABBREVIATIONS
            and parts[-1].lower() not in _HOST_ENDINGS
            and any(len(p) > 1 for p in parts)
        )
    if "_" in word:
        return any(c.isalpha() for c in word)
    return _CAMEL.search(word) is not None


# --- Numbers and URLs ---------------------------------------------------------------------

# The catalogue of number shapes (:data:`app.engine.compaction.patterns.NUMBERS`), each
# table searched as one pattern.
_DIGIT_FIRST = patterns.joined(patterns.DIGIT_FIRST, patterns.DIGIT_FIRST_PREFIX)
_SIGN_FIRST = patterns.joined(patterns.SIGN_FIRST)
_HEX_FIRST = patterns.HEX_FIRST.pattern


def _measured(value: str) -> bool:
    """Whether a measurement's number is not zero (``0 days`` measures nothing)."""
    number = value[: len(value) - len(value.lstrip("0123456789.,"))]
    return number.strip("0.,") != ""


def _pinned(text: str, start: int) -> bool:
    before = text[max(0, start - 2) : start]
    return before[-1:] in ("<", ">", "~", "^", "@") or before in ("==", ">=", "<=", "~=", "!=")


_URL = re.compile(r"(?:https?|wss?|ftp|file)://[^\s<>\"'`(){}\[\]|\\^]+")


def _numbers(text: str) -> Iterator[tuple[int, str]]:
    """The specific numbers of ``text`` with where they start (docs/compaction-heuristics.md)."""
    for m in _DIGIT_FIRST.finditer(text):
        value, kind = m[0], m.lastgroup
        if kind == "pin" and not _pinned(text, m.start()):
            continue  # 1.5 alone: a version only when pinned (==1.5), not x=1.5
        if kind == "unit" and not _measured(value):
            continue
        yield m.start(), value
    for m in _SIGN_FIRST.finditer(text):
        yield m.start(), m[0]
    for m in _HEX_FIRST.finditer(text):
        value = m[0]
        if m.lastgroup == "uuid" or (value[0].islower() and any(c.isdigit() for c in value)):
            yield m.start(), value


# --- Commands -------------------------------------------------------------------------------

_HEREDOC = re.compile(
    r"<<(?P<dash>-?)[ \t]{0,8}(?:'(?P<sq>[^'\n]{1,64})'|\"(?P<dq>[^\"\n]{1,64})\""
    r"|(?P<word>[A-Za-z0-9_.-]{1,64}))"
)
_KEYWORDS = frozenset({"fi", "done", "esac", "then", "else", "do", "{", "}", "(", ")", ";;"})


def _skip_heredoc(script: str, i: int, delimiter: str, strip_tabs: bool) -> int:
    """Where the line after ``delimiter``'s line starts (the body read from ``i``)."""
    while i < len(script):
        end = script.find("\n", i)
        end = len(script) if end < 0 else end
        line = script[i:end]
        i = end + 1
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            break
    return min(i, len(script))


def command_lines(script: str) -> list[str]:
    """The command lines of ``script`` as written (docs/compaction-heuristics.md)."""
    script = script[:COMMAND_CHARS]
    raw: list[str] = []  # raw pieces of ``script``: each value is a substring of it
    pending: list[tuple[str, bool]] = []
    quote = ""
    start = i = 0
    n = len(script)
    while i < n:
        c = script[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1  # an escaped character, a newline too (the line goes on)
        elif c == "#" and (i == 0 or script[i - 1] in " \t\n;&|("):
            end = script.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "<" and script.startswith("<<", i) and not script.startswith("<<<", i):
            if m := _HEREDOC.match(script, i):
                word = m["sq"] or m["dq"] or m["word"] or ""
                pending.append((word, m["dash"] == "-"))
                i = m.end()
                continue
        elif c == "\n":
            line = script[start:i]
            i += 1
            if line.rstrip().endswith(("&&", "||", "|")) and not pending:
                continue  # the command goes on on the next line
            raw.append(line)
            for delimiter, strip_tabs in pending:
                i = _skip_heredoc(script, i, delimiter, strip_tabs)
            pending.clear()
            start = i
            continue
        i += 1
    raw.append(script[start:])
    out: list[str] = []
    for line in raw:
        text = line.strip()
        if not text or text.startswith("#") or text in _KEYWORDS:
            continue
        if any(program_argv(c.argv) for c in simple_commands(text)):
            out.append(text)
    return out


# --- The index ------------------------------------------------------------------------------


def _storable(value: str) -> bool:
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False  # a lone surrogate
    return True


@dataclass(slots=True)
class _Found:
    first: int
    seen: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    listed: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # The seq of the entry read now (None: not asked for), and where each listed value
    # is: the seqs of the first SEQS_PER_VALUE entries that hold it.
    seq: int | None = None
    where: dict[str, dict[str, list[int]]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def add(self, kind: str, value: str) -> None:
        value = value[:VALUE_CHARS]
        seen = self.seen[kind]
        if not value or value in seen or not _storable(value):
            if self.seq is not None and value in seen:
                at = self.where[kind].get(value)
                if at is not None and len(at) < SEQS_PER_VALUE and at[-1] != self.seq:
                    at.append(self.seq)
            return
        seen.add(value)
        if len(self.listed[kind]) < self.first:
            self.listed[kind].append(value)
            if self.seq is not None:
                self.where[kind][value] = [self.seq]


@dataclass(slots=True)
class _Budget:
    """What is left to read: of all the entries, and of the current one."""

    total: int
    per_entry: int
    entry: int = 0
    truncated: bool = False

    def start_entry(self) -> None:
        self.entry = min(self.per_entry, self.total)

    def read(self, text: str) -> str:
        """``text`` as far as the budget reads it: whole, or its head and end in whole
        lines (words, when a line is too long), joined by a newline."""
        room = self.entry
        if len(text) <= room:
            self.entry -= len(text)
            self.total -= len(text)
            return text
        self.truncated = True
        if room < 200:
            return ""
        head = text[: room // 2]
        cut = max(head.rfind("\n"), head.rfind(" "))
        head = head[:cut] if cut > 0 else head
        tail = text[len(text) - (room - len(head)) :]
        cut = min((p for p in (tail.find("\n"), tail.find(" ")) if p >= 0), default=-1)
        tail = tail[cut + 1 :] if cut >= 0 else tail
        used = len(head) + len(tail)
        self.entry -= used
        self.total -= used
        return head + "\n" + tail

    def read_head(self, text: str, limit: int) -> str:
        """The head of ``text`` the budget reads, ``limit`` characters at most: a
        command is read from its start (what ran), in one piece."""
        room = min(self.entry, limit)
        if len(text) > room:
            self.truncated = True
            text = text[:room]
        self.entry -= len(text)
        self.total -= len(text)
        return text


def _words(text: str, found: _Found, paths: frozenset[str]) -> None:
    for m in _WORD.finditer(text):
        token = m[0]
        if len(token) > TOKEN_CHARS or "://" in token:
            continue
        start, end = m.span()
        if text[start - 1 : start] == "\\" and token[0] in "ntr":
            token = token[1:]  # "\nTest": an escape in a string, then the word
        token = token.lstrip(_LEFT_STRIP).rstrip(_RIGHT_STRIP)
        if len(token) < 3:
            continue
        if "::" in token and _SCOPED.fullmatch(token):
            found.add("identifiers", token)
            continue
        # A tag's name (<output>, </output>), not a type's (List<MyType>).
        if (
            text[start - 1 : start] == "<"
            and text[end : end + 1] == ">"
            and (token.startswith("/") or token.islower())
        ):
            continue
        called = text[end : end + 1] == "("
        for piece in token.split(":") if ":" in token else (token,):
            piece = piece.rstrip(_RIGHT_STRIP)
            if len(piece) < 3:
                continue
            if piece in paths or _is_path(piece, called=called):
                found.add("paths", piece)
            elif _is_identifier(piece):
                found.add("identifiers", piece)


def _scan(text: str, found: _Found, paths: frozenset[str]) -> None:
    """The paths, identifiers, numbers and URLs of ``text``, in that order of kinds."""
    if not text:
        return
    for m in _URL.finditer(text):
        found.add("urls", m[0].rstrip(_RIGHT_STRIP))
    _words(text, found, paths)
    for _, value in sorted(_numbers(text)):
        found.add("numbers", value)


def _errors(text: str, found: _Found, *, is_error: bool, command: str | None) -> None:
    result = outcome(text, is_error=is_error, command=command)
    if not result.failed:
        return
    # A line picked for want of any that says what failed (a command's last line) is
    # not an error line; a tool that reported an error says it first, though.
    lines = [line.text for line in result.lines if line.rank != FALLBACK or is_error]
    for line in sorted(lines, key=lambda line: (text.find(line), line)):
        found.add("errors", line)


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    """The string values of ``value`` (not its keys), in order, up to MAX_STRINGS."""
    if len(out) >= MAX_STRINGS or depth > 8:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out, depth + 1)


def _tool_call(part: dict[str, Any], found: _Found, budget: _Budget, paths: frozenset[str]) -> None:
    command = command_of(part)
    if command is not None:
        view = budget.read_head(command, COMMAND_CHARS)
        for line in command_lines(view):
            found.add("commands", line)
        _scan(view, found, paths)
    raw = part.get("arguments")
    try:
        args = orjson.loads(raw) if isinstance(raw, str) and raw.strip() else None
    except orjson.JSONDecodeError:
        args = None
    if args is None:
        return
    if isinstance(args, dict):
        for key in PATH_KEYS:
            value = args.get(key)
            if isinstance(value, str) and (value in paths or posixpath.normpath(value) in paths):
                found.add("paths", value)
    values: list[str] = []
    _strings(args, values)
    for value in values:
        if value != command:  # read above
            _scan(budget.read(value), found, paths)


def _commands_by_call(entries: Sequence[Entry]) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in entries:
        if entry.role == "assistant":
            for part in entry.parts:
                command = command_of(part) if part.get("type") == "tool_call" else None
                if command is not None and isinstance(part.get("id"), str):
                    out[part["id"]] = command
    return out


def _texts(entry: Entry) -> Iterator[str]:
    for part in entry.parts:
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            yield part["text"]


def _size(entry: Entry) -> int:
    """About what reading ``entry`` whole takes: its texts and its calls' arguments."""
    size = 0
    for part in entry.parts:
        kind = part.get("type")
        value = part.get("text") if kind == "text" else part.get("arguments")
        if (kind == "text" or kind == "tool_call") and isinstance(value, str):
            size += len(value)
    return size


def _entry_share(sizes: Sequence[int]) -> int:
    """How much of each entry is read: all of the small ones, and an equal share of
    what is left for the others (within MIN_ENTRY_CHARS..ENTRY_CHARS)."""
    left = TOTAL_CHARS
    ordered = sorted(min(s, ENTRY_CHARS) for s in sizes)
    for k, size in enumerate(ordered):
        if size * (len(ordered) - k) > left:
            return max(MIN_ENTRY_CHARS, left // (len(ordered) - k))
        left -= size
    return ENTRY_CHARS


def index(
    entries: Sequence[Entry],
    *,
    first: int = FIRST,
    files: FileOps | None = None,
    seqs: Sequence[int] | None = None,
) -> dict[str, Any]:
    """What ``entries`` name, by kind (docs/compaction-heuristics.md): for each of
    :data:`KINDS`, ``{"count": distinct values, "first": the first ``first`` of them in
    the order they appear}``; and ``truncated``, when some text was left unread.

    ``seqs``: the entries' seqs (one each, in order). Each kind then has ``"seqs"`` too,
    beside ``first``: for each listed value, the seqs of the first :data:`SEQS_PER_VALUE`
    entries that hold it (in the entries read; a value is there as written, or a path
    as a tool call named it), so that ``history_read`` can open the exact place. At most
    ``first`` times :data:`SEQS_PER_VALUE` numbers a kind: the index stays bounded.

    ``files``: the file operations of ``entries`` when the caller collected them already
    (:func:`app.engine.compaction.fileops.collect`; with those of earlier compactions is fine: a
    path counts only where ``entries`` name it)."""
    found = _Found(max(0, first))
    ops = files if files is not None else collect(entries)
    paths = frozenset((*ops.read, *ops.modified))
    commands = _commands_by_call(entries)
    sizes = [_size(entry) for entry in entries]
    budget = _Budget(TOTAL_CHARS, _entry_share(sizes))
    for k, entry in enumerate(entries):
        if budget.total <= 0:
            budget.truncated = budget.truncated or any(sizes[k:])
            break
        budget.start_entry()
        if seqs is not None:
            found.seq = seqs[k]
        if entry.role == "tool":
            output = budget.read(entry.text())
            command = commands.get(entry.tool_call_id or "")
            _errors(output, found, is_error=entry.is_error, command=command)
            _scan(output, found, paths)
            continue
        for text in _texts(entry):
            view = budget.read(text)
            if entry.role == "user":
                _errors(view, found, is_error=False, command=None)
            _scan(view, found, paths)
        if entry.role == "assistant":
            for part in entry.parts:
                if part.get("type") == "tool_call":
                    _tool_call(part, found, budget, paths)
    result: dict[str, Any] = {
        kind: {"count": len(found.seen[kind]), "first": list(found.listed[kind])} for kind in KINDS
    }
    if seqs is not None:
        for kind in KINDS:
            result[kind]["seqs"] = [found.where[kind][v] for v in found.listed[kind]]
    result["truncated"] = budget.truncated
    return result
