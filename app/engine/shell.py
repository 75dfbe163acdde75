"""What a shell command line reads and modifies: the shell tools' part of
:mod:`app.engine.fileops`, and the files a patch names.

The command line is parsed the way a shell splits it, with its quotes, operators
(``&&``, ``;``, ``||``, ``|``, newlines) and here-documents. Only plain cases count:
``cat``/``head``/``tail``/``less``/``more``/``nl``/``wc``/``awk`` and ``sed`` without
``-i`` read their file operands; ``grep`` reads a file operand that clearly is a file
(it has an extension or a slash; never with ``-r``); ``sed -i``, ``tee``, ``touch``,
``rm`` (not ``-r``), ``mv`` (both ends) and ``cp`` (its destination, when it has an
extension) and output redirections (``>``, ``>>``, not ``/dev/...``) modify; a patch fed
to ``patch``, ``git apply`` or ``apply_patch`` as a here-document modifies the files it
names. A ``cd`` earlier in the same command line resolves relative paths; after a ``cd``
that cannot be followed, relative paths are dropped. The script of ``bash -c`` (or
``sh -c``, ...) is read as well, three levels deep at most. Everything else
(``python``, ``git``, ``find``, ``xargs``, ...) is ignored.

Being wrong is worse than missing a file, so a word is taken as a path only when it is
plain: not empty, no leading ``-``, no whitespace, no quote and none of
``$ ( ) ` * ? [ ] { } < > | ; & \\``. Paths are normalized (``./a/../b.py`` is
``b.py``), not resolved against any working directory the command did not state.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Found:
    """The paths found read and modified so far (a path may be in both)."""

    read: set[str] = field(default_factory=set)
    modified: set[str] = field(default_factory=set)


def add_script(script: str, found: Found) -> None:
    """Add what the command line ``script`` reads and modifies to ``found``."""
    _shell(script, found)


def add_argv(argv: Sequence[str], found: Found) -> None:
    """Add what a command run without a shell reads and modifies to ``found``
    (``["bash", "-lc", "..."]`` has its script read)."""
    _run(_Command(list(argv), [], [], None), found, None, 0)


# --- Patches ------------------------------------------------------------------------------

_PATCH_FILE = re.compile(r"^\*\*\* (?:Update File|Add File|Delete File|Move to): (.+?)\s*$")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def patch_paths(text: str) -> list[str]:
    """The files a patch changes: ``*** Update/Add/Delete File:`` and ``*** Move to:``
    lines (the apply_patch format), and unified-diff headers (``+++ b/p``, or the
    ``--- a/p`` of a deleted file). Hunk bodies are skipped by their line counts, so
    a changed line that happens to start with ``+++`` is not taken for a header."""
    paths: list[str] = []
    lines = text.splitlines()
    old_left = new_left = 0  # lines still to skip in the current unified hunk
    previous = ""
    for line in lines:
        if old_left > 0 or new_left > 0:
            if line.startswith("-"):
                old_left -= 1
            elif line.startswith("+"):
                new_left -= 1
            elif not line.startswith("\\"):
                old_left -= 1
                new_left -= 1
            continue
        if match := _PATCH_FILE.match(line):
            paths.append(match[1])
        elif match := _HUNK.match(line):
            old_left = int(match[1]) if match[1] is not None else 1
            new_left = int(match[2]) if match[2] is not None else 1
        elif line.startswith("+++ ") and previous.startswith("--- "):
            new = _diff_header_path(line, "b/")
            paths.append(new if new != "/dev/null" else _diff_header_path(previous, "a/"))
        previous = line
    return [p for raw in paths if (p := _shell_path(raw, None)) is not None]


def _diff_header_path(line: str, prefix: str) -> str:
    path = line[4:].split("\t", 1)[0].strip()
    return path[len(prefix) :] if path.startswith(prefix) else path


# --- Shell command lines ------------------------------------------------------------------


class _Op(str):
    """A shell operator, told apart from the same characters quoted."""

    __slots__ = ()


@dataclass(slots=True)
class _HereDoc:
    body: str = ""


_OPERATORS = sorted(
    [
        "&&",
        "||",
        ";;",
        ";",
        "&",
        "|",
        "|&",
        "(",
        ")",
        "<",
        ">",
        ">>",
        ">|",
        "<>",
        "&>",
        "&>>",
        ">&",
        "<&",
        "<<",
        "<<-",
        "<<<",
    ],
    key=len,
    reverse=True,
)
_SEPARATORS = frozenset({"&&", "||", ";;", ";", "&", "|", "|&", "\n", "(", ")"})
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})
_HEREDOCS = frozenset({"<<", "<<-"})
_UNSAFE = frozenset("$()`*?[]{}<>|;&'\"\\")
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})
_UNKNOWN = "\0"  # a working directory the command changed to in a way we cannot follow

Token = str | _HereDoc


def _tokenize(script: str) -> list[Token]:
    """Words, operators (as :class:`_Op`, newline included) and here-document bodies
    (right after their delimiter word), the way a POSIX shell splits ``script``.

    Quotes and backslashes are removed from words, as the shell does; ``$``
    expansions are left as they are (the caller rejects such words). A number
    written right before a redirection (``2>``) is dropped. Raises
    :class:`ValueError` on an unclosed quote."""
    tokens: list[Token] = []
    word: list[str] = []
    in_word = False
    pending: list[tuple[str, bool, _HereDoc]] = []  # here-documents awaiting their body
    expect_delimiter: str | None = None
    i, n = 0, len(script)

    def flush() -> None:
        nonlocal in_word, expect_delimiter
        if not in_word:
            return
        text = "".join(word)
        word.clear()
        in_word = False
        tokens.append(text)
        if expect_delimiter is not None:
            body = _HereDoc()
            tokens.append(body)
            pending.append((text, expect_delimiter == "<<-", body))
            expect_delimiter = None

    while i < n:
        c = script[i]
        if c in " \t":
            flush()
            i += 1
        elif c == "\n":
            flush()
            tokens.append(_Op("\n"))
            i += 1
            for delimiter, strip_tabs, body in pending:
                i = _read_heredoc(script, i, delimiter, strip_tabs, body)
            pending.clear()
        elif c == "#" and not in_word:
            end = script.find("\n", i)
            i = n if end < 0 else end
        elif c == "'":
            end = script.find("'", i + 1)
            if end < 0:
                raise ValueError("no closing single quote")
            word.append(script[i + 1 : end])
            in_word = True
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and script[i] != '"':
                if script[i] == "\\" and i + 1 < n and script[i + 1] in '"\\$`\n':
                    if script[i + 1] != "\n":
                        word.append(script[i + 1])
                    i += 2
                else:
                    word.append(script[i])
                    i += 1
            if i >= n:
                raise ValueError("no closing double quote")
            in_word = True
            i += 1
        elif c == "\\":
            if i + 1 < n and script[i + 1] != "\n":
                word.append(script[i + 1])
                in_word = True
            i += 2
        elif c in ";&|<>()":
            if in_word and c in "<>" and "".join(word).isdigit():
                word.clear()  # an io number: 2>&1, 2>/dev/null
                in_word = False
            flush()
            op = next(o for o in _OPERATORS if script.startswith(o, i))
            tokens.append(_Op(op))
            i += len(op)
            if op in _HEREDOCS:
                expect_delimiter = op
        else:
            word.append(c)
            in_word = True
            i += 1
    flush()
    return tokens


def _read_heredoc(script: str, start: int, delimiter: str, strip_tabs: bool, out: _HereDoc) -> int:
    """Read the body starting at ``start`` up to the delimiter line; where to go on."""
    i = start
    lines: list[str] = []
    while i < len(script):
        end = script.find("\n", i)
        end = len(script) if end < 0 else end
        line = script[i:end]
        i = end + 1
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            break
        lines.append(line)
    out.body = "\n".join(lines)
    return min(i, len(script))


@dataclass(slots=True)
class _Command:
    """One simple command: its words and what its redirections name."""

    argv: list[str]
    writes: list[str]
    reads: list[str]
    stdin: str | None  # a here-document or here-string


def _shell(script: str, found: Found, cwd: str | None = None, depth: int = 0) -> None:
    try:
        tokens = _tokenize(script)
    except ValueError:
        return  # an unclosed quote: the words cannot be trusted
    stack: list[str | None] = []
    command = _Command([], [], [], None)
    i = 0
    while i <= len(tokens):
        token = tokens[i] if i < len(tokens) else _Op("\n")
        i += 1
        if isinstance(token, _HereDoc):
            command.stdin = token.body
        elif isinstance(token, _Op) and token in _SEPARATORS:
            cwd = _run(command, found, cwd, depth)
            command = _Command([], [], [], None)
            if token == "(":
                stack.append(cwd)
            elif token == ")" and stack:
                cwd = stack.pop()
        elif isinstance(token, _Op):
            target = tokens[i] if i < len(tokens) else None
            if isinstance(target, str) and not isinstance(target, _Op):
                i += 1
                if token in _WRITES:
                    command.writes.append(target)
                elif token in ("<", "<>"):
                    command.reads.append(target)
                elif token == "<<<":
                    command.stdin = target
        else:
            command.argv.append(token)


_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PREFIXES = frozenset({"sudo", "command", "builtin", "nohup", "time", "env", "exec"})
_RESERVED = frozenset({"{", "}", "!", "if", "then", "else", "elif", "do", "while", "until"})


def _run(command: _Command, found: Found, cwd: str | None, depth: int) -> str | None:
    """Record what ``command`` reads and writes; the working directory after it."""
    for target in command.writes:
        if not target.isdigit() and target != "-" and (p := _shell_path(target, cwd)):
            found.modified.add(p)
    for target in command.reads:
        if p := _shell_path(target, cwd):
            found.read.add(p)

    argv = command.argv
    while argv and (argv[0] in _PREFIXES or argv[0] in _RESERVED or _ENV_ASSIGNMENT.match(argv[0])):
        argv = argv[1:]
    if not argv:
        return cwd
    program, args = posixpath.basename(argv[0]), argv[1:]

    if program == "cd":
        return _cd(args, cwd)
    if program in _SHELLS:
        for k, arg in enumerate(args[:-1]):
            if arg.startswith("-") and "c" in arg and depth < 3:
                _shell(args[k + 1], found, cwd, depth + 1)
                break
        return cwd
    handler = _HANDLERS.get(program)
    if handler is not None:
        read, modified = handler(args, command.stdin)
        found.read.update(p for a in read if (p := _shell_path(a, cwd)))
        found.modified.update(p for a in modified if (p := _shell_path(a, cwd)))
    return cwd


def _cd(args: list[str], cwd: str | None) -> str | None:
    operands = [a for a in args if not a.startswith("-")]
    if len(operands) != 1 or not _plain(operands[0]) or operands[0].startswith("~"):
        return _UNKNOWN
    target = operands[0]
    if target.startswith("/") or cwd is None:
        return posixpath.normpath(target)
    if cwd == _UNKNOWN:
        return _UNKNOWN
    return posixpath.normpath(posixpath.join(cwd, target))


def _plain(word: str) -> bool:
    return (
        bool(word)
        and not word.startswith("-")
        and not any(c in _UNSAFE or c.isspace() for c in word)
    )


def _shell_path(word: str, cwd: str | None) -> str | None:
    """``word`` as a path, when it plainly is one; relative to ``cwd`` if known."""
    if not _plain(word) or word.isdigit() or word.startswith(("~", "+")) or word.endswith("/"):
        return None
    if word.startswith("/"):
        path = posixpath.normpath(word)
    elif cwd == _UNKNOWN:
        return None
    else:
        path = posixpath.normpath(posixpath.join(cwd, word) if cwd else word)
    if path in (".", "..", "/") or path.startswith("/dev/") or path == "/dev":
        return None
    return path


def _has_extension(path: str) -> bool:
    stem, ext = posixpath.splitext(posixpath.basename(path))
    return bool(stem) and len(ext) > 1


def _operands(
    args: Sequence[str], with_value: str = "", long_with_value: frozenset[str] = frozenset()
) -> tuple[list[str], set[str]]:
    """The operands of a command and its option letters (long options as themselves).

    ``with_value`` are the short options that take a value, ``long_with_value``
    the long ones (when written without ``=``)."""
    operands: list[str] = []
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            operands += args[i:]
            break
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            flags.add(name)
            if "=" not in arg and name in long_with_value:
                i += 1
        elif arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
            for k, letter in enumerate(arg[1:], start=1):
                flags.add(letter)
                if letter in with_value:
                    if k == len(arg) - 1:
                        i += 1  # the value is the next word
                    break  # the value is the rest of this word
        elif arg.startswith("-") and len(arg) > 1:
            continue  # -20 (head, tail, grep context)
        else:
            operands.append(arg)
    return operands, flags


# (arguments, standard input if given in the command) -> (read, modified)
Handler = Callable[[list[str], str | None], tuple[list[str], list[str]]]


def _reader(with_value: str = "", long_with_value: Iterable[str] = ()) -> Handler:
    long = frozenset(long_with_value)

    def handle(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
        return _operands(args, with_value, long)[0], []

    return handle


def _writer(with_value: str = "", recursive_skips: bool = False) -> Handler:
    def handle(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
        operands, flags = _operands(args, with_value)
        if recursive_skips and flags & {"r", "R", "--recursive"}:
            return [], []  # likely directories
        return [], operands

    return handle


def _sed(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    if "-i" in args and args[args.index("-i") + 1 : args.index("-i") + 2] == [""]:
        del args[args.index("-i") + 1]  # BSD sed: -i '' (no backup suffix)
    operands, flags = _operands(args, "efl", frozenset({"--expression", "--file", "--line-length"}))
    scripted = bool(flags & {"e", "f", "--expression", "--file"})
    files = operands if scripted else operands[1:]
    in_place = "i" in flags or "--in-place" in flags
    return ([], files) if in_place else (files, [])


def _awk(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    operands, flags = _operands(args, "Ffv", frozenset({"--file", "--field-separator", "--assign"}))
    files = operands if flags & {"f", "--file"} else operands[1:]
    if flags & {"i", "--include"}:
        return [], []  # gawk -i inplace edits; not worth the guess
    return [f for f in files if "=" not in f], []


_GREP_LONG = frozenset(
    {
        "--regexp",
        "--file",
        "--after-context",
        "--before-context",
        "--context",
        "--max-count",
        "--include",
        "--exclude",
        "--exclude-dir",
        "--exclude-from",
        "--label",
        "--directories",
        "--devices",
        "--binary-files",
        "--group-separator",
    }
)


def _grep(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    operands, flags = _operands(args, "efABCmdD", _GREP_LONG)
    if flags & {"r", "R", "--recursive", "--dereference-recursive"}:
        return [], []
    files = operands if flags & {"e", "f", "--regexp", "--file"} else operands[1:]
    return [f for f in files if _has_extension(f) or "/" in f], []


def _move(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    return _transfer(args, keep_sources=False)


def _copy(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    return _transfer(args, keep_sources=True)


def _transfer(args: list[str], *, keep_sources: bool) -> tuple[list[str], list[str]]:
    operands, flags = _operands(args, "tS", frozenset({"--target-directory", "--suffix"}))
    if flags & {"r", "R", "a", "--recursive", "--archive"}:
        return [], []
    if flags & {"t", "--target-directory"}:
        return [], [] if keep_sources else operands
    if len(operands) < 2:
        return [], []
    *sources, destination = operands
    # Several sources, or no extension: the destination may well be a directory.
    modified = [destination] if len(sources) == 1 and _has_extension(destination) else []
    return [], modified if keep_sources else modified + sources


def _patcher(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    texts = [stdin] if stdin is not None else []
    texts += [a for a in args if "\n" in a]  # apply_patch "*** Begin Patch..."
    return [], [p for text in texts for p in patch_paths(text)]


def _git(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    if args[:1] == ["apply"] and stdin is not None:
        return _patcher([], stdin)
    return [], []


_HANDLERS: dict[str, Handler] = {
    "cat": _reader(),
    "head": _reader("nc", ("--lines", "--bytes")),
    "tail": _reader("ncs", ("--lines", "--bytes", "--sleep-interval", "--pid")),
    "less": _reader("bhjkoOpPtTxyz"),
    "more": _reader("n"),
    "nl": _reader("bdfhilnsvw"),
    "wc": _reader(),
    "sed": _sed,
    "awk": _awk,
    "grep": _grep,
    "egrep": _grep,
    "fgrep": _grep,
    "tee": _writer(),
    "touch": _writer("dtr"),
    "rm": _writer(recursive_skips=True),
    "mv": _move,
    "cp": _copy,
    "patch": _patcher,
    "apply_patch": _patcher,
    "applypatch": _patcher,
    "git": _git,
}
