"""What a shell command line reads and modifies: the shell tools' part of
:mod:`app.engine.compaction.fileops`, and the files a patch names.

The command line is parsed the way a shell splits it, with its quotes, operators and
here-documents; only plain cases count, since being wrong is worse than missing a file.
The plain commands whose files count are the rows of :data:`SHELL_COMMANDS`; patches,
``git``, Python code (parsed, not run), scripts written earlier in the history and
``cd`` are read by the code below. The rules are specified in
docs/compaction-heuristics.md, "Shell command lines".
"""

from __future__ import annotations

import ast
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

# A remembered file text longer than this is cut: a script or a patch is much shorter.
MAX_CONTENT_CHARS = 1_000_000


@dataclass(slots=True)
class Found:
    """The paths found read and modified so far (a path may be in both), and the texts
    the commands wrote into files, by path, for the commands that run them later."""

    read: set[str] = field(default_factory=set)
    modified: set[str] = field(default_factory=set)
    contents: dict[str, str] = field(default_factory=dict)

    def remember(self, path: str, text: str, *, append: bool = False) -> None:
        """Remember that ``path`` now holds ``text`` (or ``text`` was added to it)."""
        if append:
            text = self.contents.get(path, "") + text
        self.contents[path] = text[:MAX_CONTENT_CHARS]

    def text_of(self, path: str) -> str | None:
        """The remembered text of ``path``: by its exact path, else the one remembered
        path that ends with it (or it ends with), so that ``python fix.py`` finds the
        ``/testbed/fix.py`` written after a ``cd /testbed``."""
        if path in self.contents:
            return self.contents[path]
        matches = [
            p
            for p in self.contents
            if p.endswith("/" + path.lstrip("/")) or path.endswith("/" + p.lstrip("/"))
        ]
        return self.contents[matches[0]] if len(matches) == 1 else None


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
    appends: set[str] = field(default_factory=set)  # the writes by ``>>`` (or ``&>>``)
    piped: bool = False  # its standard input is the previous command's output


def _commands(script: str) -> Iterator[_Command]:
    """The simple commands of ``script``, in order (none if a quote is not closed)."""
    try:
        tokens = _tokenize(script)
    except ValueError:
        return  # an unclosed quote: the words cannot be trusted
    command = _Command([], [], [], None)
    i = 0
    while i <= len(tokens):
        token = tokens[i] if i < len(tokens) else _Op("\n")
        i += 1
        if isinstance(token, _HereDoc):
            command.stdin = token.body
        elif isinstance(token, _Op) and token in _SEPARATORS:
            yield command
            command = _Command([], [], [], None, piped=token in ("|", "|&"))
            if token in ("(", ")"):
                yield _Command([token], [], [], None)  # a subshell's bounds, for cd
        elif isinstance(token, _Op):
            target = tokens[i] if i < len(tokens) else None
            if isinstance(target, str) and not isinstance(target, _Op):
                i += 1
                if token in _WRITES:
                    command.writes.append(target)
                    if token in (">>", "&>>"):
                        command.appends.add(target)
                elif token in ("<", "<>"):
                    command.reads.append(target)
                elif token == "<<<":
                    command.stdin = target + "\n"
        else:
            command.argv.append(token)


SimpleCommand = _Command


def simple_commands(script: str, depth: int = 0) -> list[SimpleCommand]:
    """The simple commands of the command line ``script``, in order, with the script
    of a ``bash -c`` in place of that command (three levels deep at most); none when a
    quote is not closed. Each has its words (``argv``, quotes removed), the targets of
    its redirections (``writes``, ``reads``), its here-document (``stdin``) and whether
    it reads the previous command's output (``piped``)."""
    out: list[SimpleCommand] = []
    for command in _commands(script):
        if command.argv in (["("], [")"]):
            continue
        argv = program_argv(command.argv)
        if argv and posixpath.basename(argv[0]) in _SHELLS and depth < 3:
            inner = next(
                (
                    argv[k + 1]
                    for k, a in enumerate(argv[1:-1], start=1)
                    if a.startswith("-") and not a.startswith("--") and "c" in a
                ),
                None,
            )
            if inner is not None:
                out += simple_commands(inner, depth + 1)
                continue
        out.append(command)
    return out


def _shell(script: str, found: Found, cwd: str | None = None, depth: int = 0) -> None:
    stack: list[str | None] = []
    for command in _commands(script):
        if command.argv == ["("]:
            stack.append(cwd)
        elif command.argv == [")"]:
            cwd = stack.pop() if stack else cwd
        else:
            cwd = _run(command, found, cwd, depth)


_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PREFIXES = frozenset({"sudo", "command", "builtin", "nohup", "time", "env", "exec"})
_RESERVED = frozenset({"{", "}", "!", "if", "then", "else", "elif", "do", "while", "until"})
_PYTHON = re.compile(r"python(?:\d+(?:\.\d+)*)?")
_WRITERS = frozenset({"cat", "tee"})  # what they write is their standard input


def program_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without what runs it (``sudo``, ``env``, ``time``, ``timeout 60``,
    variable assignments, ``if``/``then``/...): the program and its arguments."""
    argv = list(argv)
    while argv:
        if argv[0] in _PREFIXES or argv[0] in _RESERVED or _ENV_ASSIGNMENT.match(argv[0]):
            argv = argv[1:]
        elif argv[0] == "timeout" and len(argv) > 2:
            rest = argv[1:]
            while rest and rest[0].startswith("-"):
                rest = rest[2:] if rest[0] in ("-s", "-k", "--signal", "--kill-after") else rest[1:]
            argv = rest[1:]  # past the duration
        else:
            break
    return argv


def _run(command: _Command, found: Found, cwd: str | None, depth: int) -> str | None:
    """Record what ``command`` reads and writes; the working directory after it."""
    for target in command.writes:
        if not target.isdigit() and target != "-" and (p := _shell_path(target, cwd)):
            found.modified.add(p)
    for target in command.reads:
        if p := _shell_path(target, cwd):
            found.read.add(p)

    argv = program_argv(command.argv)
    if not argv:
        return cwd
    program, args = posixpath.basename(argv[0]), argv[1:]
    stdin = command.stdin
    if stdin is None and len(command.reads) == 1 and not command.piped:
        stdin = _known(found, command.reads[0], cwd)  # patch -p1 < fix.patch

    if program == "cd":
        return _cd(args, cwd)
    if program in _WRITERS and command.stdin is not None and (program == "tee" or not args):
        _remember(command, args if program == "tee" else [], found, cwd)
    if program in _SHELLS:
        _shell_program(args, found, cwd, depth)
        return cwd
    if "/" in argv[0] and (script := _known(found, argv[0], cwd)) is not None and depth < 3:
        _shell(script, found, cwd, depth + 1)  # ./fix.sh, written earlier
        return cwd
    if _PYTHON.fullmatch(program):
        code = _python_code(args, stdin, found, cwd)
        if code is not None:
            found.modified.update(
                p for a in python_writes(code) if (p := _script_path(a, cwd, code))
            )
        return cwd
    if program == "git":
        cwd_git, modified = _git(args, stdin, found, cwd)
        found.modified.update(p for a in modified if (p := _shell_path(a, cwd_git)))
        return cwd
    if program == "patch":
        modified = _patch(args, stdin, found, cwd)
        found.modified.update(p for a in modified if (p := _shell_path(a, cwd)))
        return cwd
    handler = _HANDLERS.get(program)
    if handler is not None:
        read, modified = handler(args, stdin)
        found.read.update(p for a in read if (p := _shell_path(a, cwd)))
        found.modified.update(p for a in modified if (p := _shell_path(a, cwd)))
    return cwd


def _remember(command: _Command, operands: list[str], found: Found, cwd: str | None) -> None:
    """``cat > f << 'EOF'`` and ``tee f << 'EOF'``: ``f`` now holds the here-document."""
    body = command.stdin or ""
    tee_append = any(a in ("-a", "--append") for a in operands)
    targets = [(t, t in command.appends) for t in command.writes]
    targets += [(t, tee_append) for t in operands if not t.startswith("-")]
    for target, append in targets:
        if not target.isdigit() and (p := _shell_path(target, cwd)) is not None:
            found.remember(p, body + "\n" if body else body, append=append)


def _known(found: Found, word: str, cwd: str | None) -> str | None:
    path = _shell_path(word, cwd)
    return found.text_of(path) if path is not None else None


def _shell_program(args: list[str], found: Found, cwd: str | None, depth: int) -> None:
    """``bash -c '...'`` (its script read), or ``bash fix.sh`` (fix.sh's text, if known)."""
    if depth >= 3:
        return
    for k, arg in enumerate(args):
        if arg.startswith("-") and "c" in arg and not arg.startswith("--"):
            if k + 1 < len(args):
                _shell(args[k + 1], found, cwd, depth + 1)
            return
        if not arg.startswith("-"):
            if (script := _known(found, arg, cwd)) is not None:
                _shell(script, found, cwd, depth + 1)
            return


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


def _perl(args: list[str], stdin: str | None) -> tuple[list[str], list[str]]:
    """``perl -pi -e '...' f``: ``f`` is edited in place (``-i``, ``-i.bak``)."""
    in_place = scripted = False
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            operands += args[i:]
            break
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            for k, letter in enumerate(arg[1:], start=1):
                if letter == "i":
                    in_place = True
                    break  # the rest of the word is the backup suffix
                if letter in "eE":
                    scripted = True
                    i += k == len(arg) - 1  # the code is the next word
                    break
                if letter in "IMmlx0":
                    break  # the rest of the word is the option's value
        else:
            operands.append(arg)
    if not in_place:
        return [], []
    return [], operands if scripted else operands[1:]


def _git(
    args: list[str], stdin: str | None, found: Found, cwd: str | None
) -> tuple[str | None, list[str]]:
    """The working directory git's paths are relative to, and the files it modifies."""
    while args and args[0].startswith("-"):
        if args[0] == "-C" and len(args) > 1:
            cwd = _cd([args[1]], cwd)
            args = args[2:]
        elif args[0] in ("-c", "--git-dir", "--work-tree", "--namespace") and len(args) > 1:
            args = args[2:]
        else:
            args = args[1:]
    if not args:
        return cwd, []
    sub, rest = args[0], args[1:]
    if sub == "apply":
        return cwd, _git_apply(rest, stdin, found, cwd)
    if sub == "checkout":
        return cwd, _git_checkout(rest)
    if sub == "restore":
        operands, flags = _operands(rest, "s", frozenset({"--source", "--pathspec-from-file"}))
        staged_only = flags & {"S", "--staged"} and not flags & {"W", "--worktree"}
        return cwd, [] if staged_only or "--pathspec-from-file" in flags else operands
    if sub == "mv":
        operands, flags = _operands(rest)
        return cwd, operands if len(operands) == 2 else []
    if sub == "rm":
        operands, flags = _operands(rest)
        recursive = flags & {"r", "--cached"}
        return cwd, [] if recursive else operands
    return cwd, []


_GIT_APPLY_READ_ONLY = frozenset({"--check", "--stat", "--numstat", "--summary", "--cached"})


def _git_apply(args: list[str], stdin: str | None, found: Found, cwd: str | None) -> list[str]:
    operands, flags = _operands(
        args, "pC", frozenset({"--directory", "--include", "--exclude", "--whitespace"})
    )
    if flags & _GIT_APPLY_READ_ONLY and "--index" not in flags:
        return []
    texts = [t for a in operands if (t := _known(found, a, cwd)) is not None]
    if not operands and stdin is not None:
        texts.append(stdin)
    return [p for text in texts for p in patch_paths(text)]


def _git_checkout(args: list[str]) -> list[str]:
    if "--" in args:
        return [a for a in args[args.index("--") + 1 :]]
    operands, flags = _operands(args, "bB", frozenset({"--orphan", "--conflict"}))
    if flags & {"b", "B", "--orphan", "--detach", "--track", "t"}:
        return []
    # Without ``--`` an operand may be a branch or a tag (``v2.9.0``): only file names count.
    return [a for a in operands if _looks_like_file(a)]


def _looks_like_file(word: str) -> bool:
    stem, ext = posixpath.splitext(posixpath.basename(word))
    return bool(stem) and any(c.isalpha() for c in ext)


def _patch(args: list[str], stdin: str | None, found: Found, cwd: str | None) -> list[str]:
    """``patch``: the file it is given (``patch f < x.diff``), else those its patch names
    (a here-document, ``< x.patch`` or ``-i x.patch`` written earlier)."""
    operands, flags = _operands(
        args,
        "pidDBFgrVYzoE",
        frozenset({"--input", "--directory", "--strip", "--output", "--reject-file", "--suffix"}),
    )
    if flags & {"--dry-run", "C", "--check"}:
        return []
    if operands:
        return operands[:1]  # patch [options] [originalfile [patchfile]]
    text = stdin
    for k, arg in enumerate(args):
        value = None
        if arg in ("-i", "--input") and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith("--input="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-i") and len(arg) > 2:
            value = arg[2:]
        if value is not None:
            text = _known(found, value, cwd)
    return patch_paths(text) if text is not None else []


# --- Python code ---------------------------------------------------------------------------


def _python_code(args: list[str], stdin: str | None, found: Found, cwd: str | None) -> str | None:
    """The code a ``python`` command runs: ``-c``'s, its standard input's
    (``python - <<'EOF'``, ``python3 <<EOF``), or its script's when an earlier
    command wrote it; None for ``-m`` and anything unknown."""
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "-":
            return stdin
        if arg.startswith("--"):
            continue
        if arg.startswith("-") and len(arg) > 1:
            for k, letter in enumerate(arg[1:], start=1):
                if letter in "cm":
                    if letter == "m":
                        return None
                    rest = arg[k + 1 :]
                    return rest or (args[i] if i < len(args) else None)
                if letter in "WX":
                    i += k == len(arg) - 1  # the value is the next word
                    break
            continue
        return _known(found, arg, cwd)
    return stdin


def _script_path(word: str, cwd: str | None, code: str) -> str | None:
    """A path the code names, relative to ``cwd``; a relative path is dropped when
    the code changes its working directory."""
    if not word.startswith("/") and "chdir" in code:
        return None
    return _shell_path(word, cwd)


_OPEN_FUNCS = frozenset({"open", "io.open", "codecs.open", "builtins.open"})
_PATH_TYPES = frozenset({"Path", "pathlib.Path", "PosixPath", "pathlib.PosixPath"})
_PATH_WRITES = frozenset({"write_text", "write_bytes", "touch"})
_COPIES = frozenset({"shutil.copy", "shutil.copyfile", "shutil.copy2"})
_MOVES = frozenset({"shutil.move", "os.rename", "os.replace", "os.renames"})
_REMOVES = frozenset({"os.remove", "os.unlink"})


def python_writes(code: str) -> list[str]:
    """The paths Python ``code`` plainly writes (docs/compaction-heuristics.md), in order."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return []
    literal = _Literals(tree)
    paths = [
        p for node in ast.walk(tree) if isinstance(node, ast.Call) for p in _written(node, literal)
    ]
    return list(dict.fromkeys(paths))


def _written(call: ast.Call, literal: _Literals) -> list[str]:
    """The paths one call writes, when they are spelled out."""
    name = _dotted(call.func)
    found: list[str | None] = []
    if name in _OPEN_FUNCS:
        if _writes_mode(_argument(call, 1, "mode")):
            found.append(literal.path(_argument(call, 0, "file")))
    elif name in _COPIES:
        found.append(literal.path(_argument(call, 1, "dst")))
    elif name in _MOVES:
        found += [literal.path(_argument(call, k, None)) for k in (0, 1)]
    elif name in _REMOVES:
        found.append(literal.path(_argument(call, 0, "path")))
    elif isinstance(call.func, ast.Attribute) and _path_method_writes(call):
        found.append(literal.path_object(call.func.value))
    return [p for p in found if p]


def _path_method_writes(call: ast.Call) -> bool:
    """``x.write_text(...)``, ``x.touch()``, ``x.open('w')``: writes, if ``x`` is a path."""
    assert isinstance(call.func, ast.Attribute)
    method = call.func.attr
    return method in _PATH_WRITES or (method == "open" and _writes_mode(_argument(call, 0, "mode")))


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def _argument(call: ast.Call, position: int, keyword: str | None) -> ast.expr | None:
    if position < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[position]
    return next((k.value for k in call.keywords if keyword and k.arg == keyword), None)


def _writes_mode(mode: ast.expr | None) -> bool:
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and any(c in mode.value for c in "wax+")
    )


class _Literals:
    """The string values a script spells out: literals, and the names it binds
    once, to a literal (``path = 'src/a.py'``)."""

    def __init__(self, tree: ast.Module) -> None:
        bindings: dict[str, int] = {}
        values: dict[str, ast.expr] = {}
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names = [node.id]
            elif isinstance(node, ast.arg):
                names = [node.arg]
            elif isinstance(node, ast.alias):
                names = [(node.asname or node.name).split(".")[0]]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
                names = [node.name] if node.name else []
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names = list(node.names) * 2  # rebound elsewhere: never a constant
            for name in names:
                bindings[name] = bindings.get(name, 0) + 1
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                values[node.targets[0].id] = node.value
        self.names = {n: v for n, v in values.items() if bindings.get(n) == 1}

    def string(self, node: ast.expr | None, depth: int = 0) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names and depth < 3:
            return self.string(self.names[node.id], depth + 1)
        if isinstance(node, ast.Call) and _dotted(node.func) == "os.path.join" and node.args:
            parts = [self.string(a, depth + 1) for a in node.args]
            if node.keywords or any(p is None for p in parts):
                return None
            return posixpath.join(*(p for p in parts if p is not None))
        return None

    def path(self, node: ast.expr | None) -> str | None:
        """A path given as a string or as a ``Path``."""
        return self.string(node) or self.path_object(node)

    def path_object(self, node: ast.expr | None, depth: int = 0) -> str | None:
        """The path of ``Path('a')``, ``Path('a') / 'b'``, or a name bound once to one."""
        if isinstance(node, ast.Call) and _dotted(node.func) in _PATH_TYPES:
            if len(node.args) >= 1 and not node.keywords:
                parts = [self.string(a) for a in node.args]
                if all(p is not None for p in parts):
                    return posixpath.join(*(p for p in parts if p is not None))
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = self.path_object(node.left, depth)
            right = self.string(node.right)
            return posixpath.join(left, right) if left is not None and right is not None else None
        if isinstance(node, ast.Name) and node.id in self.names and depth < 3:
            return self.path_object(self.names[node.id], depth + 1)
        return None


@dataclass(frozen=True, slots=True)
class Example:
    """A command line and the files it reads and modifies, sorted."""

    command: str
    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CommandShape:
    """One row of :data:`SHELL_COMMANDS`: the programs it covers (by name, as a shell
    finds them), how their arguments say what they read and modify (``handler``), and
    examples of it. ``cd``, ``git``, ``patch``, Python, the shells and a script run by
    path are read by code of their own (:func:`_run`)."""

    name: str
    programs: frozenset[str]
    handler: Handler
    examples: tuple[Example, ...]


def _row(name: str, programs: str, handler: Handler, *examples: Example) -> CommandShape:
    return CommandShape(name, frozenset(programs.split()), handler, examples)


# The plain commands whose files count (docs/compaction-heuristics.md, "Shell command
# lines"): a new one is a row, with examples that tests/engine/test_fileops_corpus.py runs.
SHELL_COMMANDS: tuple[CommandShape, ...] = (
    _row("cat", "cat", _reader(), Example("cat a.py notes.txt", read=("a.py", "notes.txt"))),
    _row(
        "head",
        "head",
        _reader("nc", ("--lines", "--bytes")),
        Example("head -n 20 src/app.py", read=("src/app.py",)),
    ),
    _row(
        "tail",
        "tail",
        _reader("ncs", ("--lines", "--bytes", "--sleep-interval", "--pid")),
        Example("tail -n 50 logs/run.log", read=("logs/run.log",)),
    ),
    _row("less", "less", _reader("bhjkoOpPtTxyz"), Example("less README.md", read=("README.md",))),
    _row("more", "more", _reader("n"), Example("more notes.txt", read=("notes.txt",))),
    _row("nl", "nl", _reader("bdfhilnsvw"), Example("nl -ba src/a.py", read=("src/a.py",))),
    _row("wc", "wc", _reader(), Example("wc -l data.csv", read=("data.csv",))),
    _row(
        "sed",
        "sed",
        _sed,
        Example("sed -n '1,20p' src/a.py", read=("src/a.py",)),
        Example("sed -i 's/old/new/g' src/a.py", modified=("src/a.py",)),
        Example("sed -i '' -e 's/a/b/' b.py", modified=("b.py",)),
    ),
    _row("awk", "awk", _awk, Example("awk '{print $1}' data.csv", read=("data.csv",))),
    _row(
        "grep",
        "grep egrep fgrep",
        _grep,
        Example("grep -n TODO src/a.py", read=("src/a.py",)),
        Example("egrep 'x|y' notes.txt", read=("notes.txt",)),
    ),
    _row("tee", "tee", _writer(), Example("echo done | tee out.txt", modified=("out.txt",))),
    _row("touch", "touch", _writer("dtr"), Example("touch src/new.py", modified=("src/new.py",))),
    _row("rm", "rm", _writer(recursive_skips=True), Example("rm old.py", modified=("old.py",))),
    _row("mv", "mv", _move, Example("mv a.py b.py", modified=("a.py", "b.py"))),
    _row("cp", "cp", _copy, Example("cp a.py b.py", modified=("b.py",))),
    _row(
        "apply-patch",
        "apply_patch applypatch",
        _patcher,
        Example(
            "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/a.py\n@@\n-x\n+y\n"
            "*** End Patch\nEOF",
            modified=("src/a.py",),
        ),
    ),
    _row(
        "perl",
        "perl",
        _perl,
        Example("perl -pi -e 's/a/b/' src/a.py", modified=("src/a.py",)),
    ),
)
_HANDLERS: dict[str, Handler] = {
    program: row.handler for row in SHELL_COMMANDS for program in sorted(row.programs)
}
