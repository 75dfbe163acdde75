"""The continuity measurement's own rules (docs/how-it-works.md, "Compaction"), independent of the summarizer.

What an agent needs after a compaction, read from the trace itself: the task's
distinctive terms, every file modified so far, and the last failure before the cut;
and whether a context (the list of messages the agent would be sent) still holds each.
Nothing here imports the summarizer's extraction code (``app.engine.compaction.extractive``,
``fileops``, ``summary``): the measure must not share the blind spots of what it
measures. Every rule is a few regular expressions or a small parser, stated here and
checked on hand-written cases in ``tests/bench/test_continuity_rules.py``.

**Task terms** (:func:`task_terms`). From the agent's first user request, the whole
of it: every inline backticked span (single backticks, not a fence), and every word
outside markup tags such as ``<pr_description>`` (a run of letters, digits, ``_``,
``.``, ``/``, ``:``, ``-``; stripped of leading ``./`` and of trailing ``.``, ``/``,
``:``, ``-``) that holds a dot, a slash or an underscore, is camelCase (an upper-case
letter after its first character, and a lower-case one: ``DateTime``, ``PVSystem``),
or ends in ``Error`` or ``Exception``; either kind longer than 3 characters, with a
letter or a digit; duplicates dropped, first seen first. A term is kept when the
context holds it verbatim (case-sensitive, whitespace runs taken as one space).

**Modified files** (:func:`writes_of_call`). A file is modified by:

- an edit-style tool call (``edit``, ``write``, ``create_file``, ``str_replace_editor``
  with a ``create``/``str_replace``/``insert`` command...) naming it in ``path``,
  ``file_path``, ``filename``, ``file`` or ``target_file``; an ``apply_patch`` call,
  by the files its patch names;
- a shell command (the ``command``/``cmd`` argument), read with a shell tokenizer
  (quotes respected; heredoc bodies set apart): the target of an output redirection
  (``>``, ``>>``, ``&>``, ``>|``; not ``/dev/...``, not a descriptor), ``sed -i`` and
  ``perl -i`` (their file operands), ``tee`` (its operands), Python code run by
  ``python -c``, by ``python`` fed a heredoc, or by ``python script.py`` when the
  trace wrote that script with a heredoc earlier: ``open(p, "w"|"a"|"x"|"r+"...)``
  and ``Path(p).write_text``/``write_bytes``, ``p`` a string literal, a
  ``os.path.join`` of literals, or a name assigned one of those in the same code;
  ``git apply`` and ``patch`` by the ``+++`` paths of the patch (a heredoc, or a file
  the trace wrote with a heredoc), counted only when the command exited 0 (a patch
  that did not apply modified nothing; ``patch file`` names its file outright).
- Not counted: ``cp``, ``mv``, ``rm``, ``touch``, ``git checkout``/``stash``, paths
  built at run time (``$VAR``, globs, f-strings with fields), and anything a program
  writes on its own.

Paths are resolved against the working directory (``/testbed`` in these traces,
changed by a ``cd`` earlier in the same command) and given relative to it when
inside it. A file is *named* in a context when its path occurs there bounded as a
path (not inside a longer name; ``/testbed/`` or ``./`` before it allowed), and
*listed* when a line of the summary's ``<modified-files>`` section is that path (the
same resolution applied to the line).

**Failures** (:func:`failure_of`). A tool output failed when a line of it is an
error line, or, failing that, its exit status is not 0. Error lines, the last one
of the output being the failure's line:

- a traceback's last line: the first line at column 0 after ``Traceback (most
  recent call last):`` and its indented frames (any exception name:
  ``django.core.exceptions.ImproperlyConfigured: ...``, ``KeyboardInterrupt``);
  also when a pipe (``| tail -20``) cut the header off: the frames start at an
  indented ``File "...", line N`` and the line at column 0 after them is an
  exception's name, dotted or not (``django.core.exceptions.ImproperlyConfigured: ...``);
- a Python syntax error (``SyntaxError``, ``IndentationError``, ``TabError``, at
  column 0 or after pytest's ``E``): its line, and where it is, the ``File "x",
  line N`` printed above it (both must be kept: the message often stays the same
  from one run to the next while the line number changes);
- an exception line: at column 0 (or after pytest's ``E   ``), a name, dotted or
  not, ending in ``Error`` or ``Exception``, then ``:``;
- unittest's summary, ``FAILED (failures=2, errors=1)``;
- pytest's ``FAILED <test>`` and ``ERROR <test>`` lines;
- a shell's syntax error: ``bash: -c: line 1: syntax error near unexpected token
  ...``, ``/bin/sh: 1: Syntax error: ...``, ``... unexpected EOF while looking for
  matching ...`` (the line that follows, echoing the command, is not one);
- a tool's error: a line opening with ``error:``, ``Error:``, ``ERROR:``, ``fatal:``
  (after an optional ``program:``), or ending in ``command not found`` or ``No such
  file or directory``;
- a patch that did not apply: ``malformed patch``, ``corrupt patch``, ``patch does
  not apply``, ``patch failed``, ``Hunk #N FAILED``, ``N out of M hunks FAILED``,
  ``can't find file to patch``,
  ``Only garbage was found in the patch input``, ``Invalid patch``.

The exit status is read from ``<returncode>N</returncode>``, ``exit code N``,
``Exit code: N``, ``exit status N`` or ``exited with code N`` (the last one), or
the result's ``is_error``. Without an error line, a non-zero status is a failure
whose line is the output's last non-empty line (not a bare ``<tag>``, not the line
stating the status), or, with no output, the command itself; except exit status 1 of
a search or comparison
(``grep``, ``rg``, ``diff``, ``cmp``, ``test``... as the last command of the line),
which found nothing and did not fail.

A failure is *kept* by a context holding its key: the line with whitespace runs
taken as one space, pytest's ``E`` prefix dropped, cut to its first
:data:`KEY_CHARS` characters (a summary that quotes the line whole, or clipped
after that, keeps it); and, for a syntax error, the line that says where it is.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WORKDIR = "/testbed"
KEY_CHARS = 80
TERM_MIN_CHARS = 4

# --- texts --------------------------------------------------------------------


def normalize(text: str) -> str:
    """Whitespace runs as one space, ends stripped."""
    return " ".join(text.split())


def _arguments_text(arguments: Any) -> str:
    """A call's arguments as text: the string values of its JSON object, else as is."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
    else:
        parsed = arguments
    if isinstance(parsed, dict):
        return "\n".join(v if isinstance(v, str) else json.dumps(v) for v in parsed.values())
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def message_text(message: Mapping[str, Any]) -> str:
    """What an OpenAI chat message says: its text, and each tool call's name and arguments."""
    pieces: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        pieces.extend(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        pieces.append(str(function.get("name", "")))
        pieces.append(_arguments_text(function.get("arguments", "")))
    return "\n".join(pieces)


def context_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """Everything a list of messages says, whitespace-normalized (what the checks search)."""
    return normalize("\n".join(message_text(m) for m in messages))


# --- (a) the task's terms -------------------------------------------------------------

_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_WORD = re.compile(r"[\w./:-]+")
_CAMEL = re.compile(r"^.+[A-Z]")
_LOWER = re.compile(r"[a-z]")
_ALNUM = re.compile(r"[^\W_]")
_TAG = re.compile(r"</?[A-Za-z][\w-]*>")  # markup, such as <pr_description>: not a term


def _distinctive(word: str) -> bool:
    return (
        any(c in word for c in "._/")
        or (_CAMEL.match(word) is not None and _LOWER.search(word) is not None)
        or word.endswith(("Error", "Exception"))
    )


def task_terms(request: str) -> list[str]:
    """The distinctive terms of a request (see the module's rule), first seen first."""
    terms: list[str] = []
    for match in _SPAN.finditer(request):
        span = normalize(match.group(1))
        if len(span) >= TERM_MIN_CHARS and _ALNUM.search(span):
            terms.append(span)
    for match in _WORD.finditer(_TAG.sub(" ", request)):
        word = match.group(0)
        while word.startswith("./"):
            word = word[2:]
        word = word.rstrip("./:-")
        if len(word) >= TERM_MIN_CHARS and _ALNUM.search(word) and _distinctive(word):
            terms.append(word)
    return list(dict.fromkeys(terms))


def terms_kept(terms: Sequence[str], text: str) -> list[str]:
    """The terms ``text`` (whitespace-normalized) holds verbatim."""
    return [t for t in terms if t in text]


# --- (b) modified files ----------------------------------------------------------------------

EDIT_TOOLS = frozenset(
    {
        "edit",
        "write",
        "multiedit",
        "multi_edit",
        "edit_file",
        "write_file",
        "create_file",
        "create",
        "str_replace",
        "replace_in_file",
        "insert",
        "notebookedit",
    }
)
EDITOR_TOOLS = frozenset({"str_replace_editor", "str_replace_based_edit_tool", "text_editor"})
EDITOR_WRITES = frozenset({"create", "str_replace", "insert", "undo_edit", "write"})
PATCH_TOOLS = frozenset({"apply_patch", "patch"})
PATH_KEYS = ("path", "file_path", "filename", "file", "target_file")
SHELL_KEYS = ("command", "cmd", "script")


@dataclass(frozen=True, slots=True)
class Write:
    """A file a tool call modified, and how (for the tests and the verbose report)."""

    path: str
    how: str


def resolve(path: str, cwd: str = WORKDIR, workdir: str = WORKDIR) -> str | None:
    """``path`` as the measure names it: absolute against ``cwd``, normalized, then
    relative to ``workdir`` when inside it. None for what is not a file the agent
    wrote (``/dev/...``, a descriptor, a path built at run time)."""
    path = path.strip().strip("'\"")
    if not path or path == "-" or any(c in path for c in "$*?`{}<>|&;\n"):
        return None
    full = posixpath.normpath(posixpath.join(cwd, path))
    if full.startswith("/dev/") or full == "/dev" or full.startswith("/proc/"):
        return None
    prefix = workdir.rstrip("/") + "/"
    if full.startswith(prefix):
        return full[len(prefix) :]
    return full


def _named_pattern(path: str, workdir: str) -> re.Pattern[str]:
    body = re.escape(path)
    if not path.startswith("/"):
        body = f"(?:{re.escape(workdir.rstrip('/'))}/|\\./)?{body}"
    return re.compile(rf"(?<![\w./-]){body}(?![\w/-]|\.\w)")


def named_in(text: str, path: str, workdir: str = WORKDIR) -> bool:
    """Whether ``text`` names the file ``path`` (resolved) as a path, not inside a longer name."""
    return _named_pattern(path, workdir).search(text) is not None


_MODIFIED_SECTION = re.compile(r"<modified-files>(.*?)</modified-files>", re.S)


def listed_modified(text: str, workdir: str = WORKDIR) -> set[str] | None:
    """The files the last ``<modified-files>`` section of ``text`` lists (resolved);
    None when there is no such section. Takes raw text: the section is line-based."""
    sections = _MODIFIED_SECTION.findall(text)
    if not sections:
        return None
    out: set[str] = set()
    for line in sections[-1].splitlines():
        line = line.strip().lstrip("-* ").strip().strip("`")
        if not line or line.startswith("(and "):
            continue
        resolved = resolve(line, workdir, workdir)
        if resolved is not None:
            out.add(resolved)
    return out


# Shell parsing.

_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)[ \t]*(['\"]?)([A-Za-z_][\w.-]*)\2")
_CONTROL_CHARS = frozenset(";&|()\n")
_REDIRECT_OUT = frozenset({">", ">>", "&>", "&>>", ">|"})
_SEARCHES = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "ack", "diff", "cmp", "test", "["})
_PREFIXES = frozenset({"sudo", "time", "env", "nohup", "command", "exec", "timeout"})
_PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")


def split_heredocs(command: str) -> tuple[str, list[str]]:
    """The command without its heredoc bodies, and the bodies in order."""
    lines = command.split("\n")
    kept: list[str] = []
    bodies: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        kept.append(line)
        i += 1
        for match in _HEREDOC.finditer(line):
            strip_tabs, delimiter = match.group(1) == "-", match.group(3)
            body: list[str] = []
            while i < len(lines):
                candidate = lines[i].lstrip("\t") if strip_tabs else lines[i]
                i += 1
                if candidate.strip() == delimiter:
                    break
                body.append(lines[i - 1])
            bodies.append("\n".join(body))
    return "\n".join(kept), bodies


# Operator characters inside quotes are text: they stand in as private-use characters
# while the lexer reads the line (which drops the quotes), so that a quoted ";;" or
# ">" is never taken for a separator or a redirection. A word made of them alone keeps
# the stand-ins; any other word gets its characters back.
_OPERATOR_CHARS = "();<>|&"
_STAND_IN = {c: chr(0xE000 + i) for i, c in enumerate(_OPERATOR_CHARS)}
_STAND_INS = frozenset(_STAND_IN.values())
_RESTORE = str.maketrans({v: k for k, v in _STAND_IN.items()})


def _quoted_operators_set_apart(shell: str) -> str:
    out: list[str] = []
    quote: str | None = None
    escaped = comment = False
    for i, ch in enumerate(shell):
        if comment:
            comment = ch != "\n"
        elif escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote is None:
            if ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or shell[i - 1] in " \t\n;&|("):
                comment = True
        elif ch == quote:
            quote = None
        elif ch in _STAND_IN:
            ch = _STAND_IN[ch]
        out.append(ch)
    return "".join(out)


def _restored(token: str) -> str:
    return token if set(token) <= _STAND_INS else token.translate(_RESTORE)


def _tokens(shell: str) -> list[str]:
    # A comment runs to the end of its line, and the lexer eats that line's newline
    # with it: each newline is doubled so that one is still there to end the command.
    shell = shell.replace("\\\n", " ").replace("\n", "\n\n")
    shell = _quoted_operators_set_apart(shell)
    lexer = shlex.shlex(shell, posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return [_restored(t) for t in lexer]
    except ValueError:  # an unclosed quote: words as they stand
        return [_restored(t) for t in shell.replace("\n", " \n ").split(" ")]


def _segments(tokens: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for token in tokens:
        if not set(token) - _CONTROL_CHARS:  # ";", "&&", "|", a run of newlines...
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def _last_command(command: str) -> list[str]:
    shell, _ = split_heredocs(command)
    segments = _segments(_tokens(shell))
    return segments[-1] if segments else []


def _operands(args: list[str], takes_value: frozenset[str]) -> list[str]:
    """The non-option words of ``args`` (an option in ``takes_value`` eats the next)."""
    out: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
            continue
        if word in takes_value:
            skip = True
        elif not word.startswith("-") or word == "-":
            out.append(word)
    return out


def _sed_files(args: list[str]) -> list[str]:
    """The files ``sed`` edits in place (its operands after the script), if ``-i``."""
    in_place = has_script = skip = False
    operands: list[str] = []
    for word in args:
        if skip:
            skip = False
        elif word.startswith("--"):
            in_place = in_place or word.startswith("--in-place")
            if word in ("--expression", "--file"):
                has_script = skip = True
            elif word.startswith(("--expression=", "--file=")):
                has_script = True
        elif word.startswith("-") and len(word) > 1:
            flags = word[1:]
            if re.match(r"[A-Za-z]*i", flags):  # -i, -i.bak, -ni: the rest is a suffix
                in_place = True
            elif flags[-1] in "ef":  # -e script, -ne script, -f script-file
                has_script = skip = True
            elif flags[-1] == "l":
                skip = True
        else:
            operands.append(word)
    if not in_place:
        return []
    return operands if has_script else operands[1:]


def _perl_files(args: list[str]) -> list[str]:
    """The files ``perl -i`` edits in place (``-pi -e code f``, ``-i.bak -pe code f``)."""
    in_place = has_script = skip = False
    operands: list[str] = []
    for word in args:
        if skip:
            skip = False
        elif word.startswith("-") and not word.startswith("--") and len(word) > 1:
            flags = word[1:]
            if re.match(r"[A-Za-z]*i", flags):
                in_place = True
            if re.fullmatch(r"[A-Za-z]*[eE]", flags):
                has_script = skip = True
        else:
            operands.append(word)
    if not in_place:
        return []
    return operands if has_script else operands[1:]


def patch_paths(patch: str) -> list[str]:
    """The files a patch changes: its ``+++`` paths (without ``a/``/``b/``), and the
    ``*** Add/Update File:`` lines of an apply_patch body; not ``/dev/null``."""
    paths: list[str] = []
    for line in patch.splitlines():
        match = re.match(r"\+\+\+ (\S+)", line) or re.match(
            r"\*\*\* (?:Add|Update) File: (.+)$", line
        )
        if match is None:
            continue
        path = match.group(1).strip()
        if path == "/dev/null":
            continue
        if path.startswith(("a/", "b/")):
            path = path[2:]
        paths.append(path)
    return paths


_JOIN = re.compile(r"os\.path\.join\(([^()]*)\)")
_STRING = re.compile(r"""^[rRbBuUfF]?(['"])([^'"\n{}]*)\1$""")


def _python_value(expr: str, names: Mapping[str, str]) -> str | None:
    """A path expression's value: a literal, ``Path(literal)``, a join of literals, a name."""
    expr = expr.strip()
    wrapped = re.fullmatch(r"(?:pathlib\.)?Path\((.*)\)", expr, re.S)
    if wrapped:
        return _python_value(wrapped.group(1), names)
    string = _STRING.match(expr)
    if string:
        return string.group(2)
    join = _JOIN.fullmatch(expr)
    if join:
        parts = [_python_value(p, names) for p in join.group(1).split(",")]
        if all(p is not None for p in parts):
            return posixpath.join(*[p for p in parts if p is not None])
        return None
    if re.fullmatch(r"[A-Za-z_]\w*", expr):
        return names.get(expr)
    return None


_ASSIGN = re.compile(r"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*(.+?)[ \t]*$", re.M)
_OPEN = re.compile(
    r"""\bopen\(\s*([^,()]+(?:\([^()]*\))?)\s*,\s*(?:mode\s*=\s*)?[rRbB]?(['"])([rwaxbt+]+)\2"""
)
_WRITE_METHOD = re.compile(
    r"((?:(?:pathlib\.)?Path\([^()]*\))|[A-Za-z_]\w*)\.write_(?:text|bytes)\("
)


def python_writes(code: str) -> list[str]:
    """The paths Python ``code`` writes by the stated rule (unresolved, as written)."""
    names: dict[str, str] = {}
    for match in _ASSIGN.finditer(code):
        value = _python_value(match.group(2), names)
        if value is not None:
            names[match.group(1)] = value
    out: list[str] = []
    for match in _OPEN.finditer(code):
        if set(match.group(3)) & set("wax+"):
            value = _python_value(match.group(1), names)
            if value is not None:
                out.append(value)
    for match in _WRITE_METHOD.finditer(code):
        value = _python_value(match.group(1), names)
        if value is not None:
            out.append(value)
    return out


@dataclass(slots=True)
class ShellState:
    """What the measure remembers across a trace's commands: the files it wrote
    with a heredoc (scripts a later ``python x.py`` runs, patches a later ``git
    apply`` applies), by resolved path."""

    contents: dict[str, str]

    @classmethod
    def new(cls) -> ShellState:
        return cls({})


_PATCH_VALUE_OPTIONS = frozenset({"-p", "-d", "-o", "-r", "-D", "-B", "-z", "-i", "--input"})


def _texts(
    sources: list[str], body: str | None, state: ShellState, cwd: str, workdir: str
) -> list[str]:
    """The patch texts a command reads: the files it names that the trace wrote, its heredoc."""
    texts = [state.contents.get(resolve(p, cwd, workdir) or "", "") for p in sources]
    return [*texts, body] if body is not None else texts


def shell_writes(
    command: str,
    state: ShellState,
    *,
    exit_code: int | None = None,
    workdir: str = WORKDIR,
) -> list[Write]:
    """The files a shell command modified, by the stated rule."""
    shell, bodies = split_heredocs(command)
    heredocs = iter(bodies)
    out: list[Write] = []
    cwd = workdir
    succeeded = exit_code in (None, 0)

    def add(path: str, how: str, base: str) -> str | None:
        resolved = resolve(path, base, workdir)
        if resolved is not None:
            out.append(Write(resolved, how))
        return resolved

    for segment in _segments(_tokens(shell)):
        words: list[str] = []
        body: str | None = None
        targets: list[str] = []
        inputs: list[str] = []
        i = 0
        while i < len(segment):
            word = segment[i]
            following = segment[i + 1] if i + 1 < len(segment) else None
            if word in ("<<", "<<-"):
                body = next(heredocs, None)
                i += 2
                continue
            if word == "<<<":
                i += 2
                continue
            if word in _REDIRECT_OUT and following is not None:
                if not (following.isdigit() or following.startswith("&")):
                    targets.append(following)
                i += 2
                continue
            if word in (">&", "<&", "&>&"):
                i += 2
                continue
            if word == "<" and following is not None:
                inputs.append(following)
                i += 2
                continue
            words.append(word)
            i += 1
        # A descriptor before a redirection ("2>file") is not an argument.
        while words and words[-1].isdigit() and targets:
            words.pop()
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], re.S):
            words.pop(0)
        while words and words[0] in _PREFIXES:
            words.pop(0)
        for target in targets:
            resolved = add(target, "redirect", cwd)
            if resolved is not None and body is not None:
                state.contents[resolved] = body
        if not words:
            continue
        program, args = posixpath.basename(words[0]), words[1:]
        if program == "cd":
            if args:
                cwd = posixpath.normpath(posixpath.join(cwd, args[0]))
            continue
        if program == "sed":
            for path in _sed_files(args):
                add(path, "sed -i", cwd)
        elif program == "perl":
            for path in _perl_files(args):
                add(path, "perl -i", cwd)
        elif program == "tee":
            for path in _operands(args, frozenset()):
                add(path, "tee", cwd)
        elif _PYTHON.match(program):
            code = None
            positional = [a for a in args if not a.startswith("-") or a == "-"]
            if "-c" in args:
                at = args.index("-c")
                code = args[at + 1] if at + 1 < len(args) else None
            elif body is not None and positional[:1] in ([], ["-"]):
                code = body
            elif positional and "-m" not in args:
                script = resolve(positional[0], cwd, workdir)
                if script is not None:
                    code = state.contents.get(script)
            for path in python_writes(code or ""):
                add(path, "python", cwd)
        elif program == "git" and args[:1] == ["apply"]:
            if not succeeded or {"--check", "--stat", "--numstat", "--summary"} & set(args):
                continue
            sources = [a for a in args[1:] if not a.startswith("-")] + inputs
            for text in _texts(sources, body, state, cwd, workdir):
                for path in patch_paths(text):
                    add(path, "git apply", cwd)
        elif program == "patch":
            if not succeeded or "--dry-run" in args:
                continue
            operands = _operands(args, _PATCH_VALUE_OPTIONS)
            if operands:  # patch [options] originalfile [patchfile]
                add(operands[0], "patch", cwd)
                continue
            sources = list(inputs)
            for at, word in enumerate(args):
                if word in ("-i", "--input") and at + 1 < len(args):
                    sources.append(args[at + 1])
                elif word.startswith("-i") and len(word) > 2:
                    sources.append(word[2:])
                elif word.startswith("--input="):
                    sources.append(word.partition("=")[2])
            for text in _texts(sources, body, state, cwd, workdir):
                for path in patch_paths(text):
                    add(path, "patch", cwd)
    return out


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def command_of(arguments: Any) -> str | None:
    """The shell command a tool call's arguments hold, if any."""
    args = _arguments(arguments)
    return next((args[k] for k in SHELL_KEYS if isinstance(args.get(k), str)), None)


def writes_of_call(
    name: str,
    arguments: Any,
    state: ShellState,
    *,
    exit_code: int | None = None,
    workdir: str = WORKDIR,
) -> list[Write]:
    """The files one tool call modified (see the module's rule)."""
    args = _arguments(arguments)
    tool = name.lower()
    if tool in PATCH_TOOLS:
        text = next((v for k, v in args.items() if isinstance(v, str) and k != "path"), "")
        if exit_code not in (None, 0):
            return []
        return [
            Write(p, "apply_patch")
            for p in (resolve(x, workdir, workdir) for x in patch_paths(text))
            if p is not None
        ]
    command = command_of(args)
    if command is not None and tool not in EDIT_TOOLS | EDITOR_TOOLS:
        return shell_writes(command, state, exit_code=exit_code, workdir=workdir)
    if tool in EDITOR_TOOLS and args.get("command") not in EDITOR_WRITES:
        return []
    if tool in EDIT_TOOLS | EDITOR_TOOLS:
        for key in PATH_KEYS:
            value = args.get(key)
            if isinstance(value, str):
                resolved = resolve(value, workdir, workdir)
                return [] if resolved is None else [Write(resolved, tool)]
    return []


# --- (c) failures ---------------------------------------------------------------------

_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
_FRAME_LINE = re.compile(r'^(?:E)?\s+File "[^"]+", line \d+')
_NAMED = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::|$)")  # an exception's name first
_SYNTAX = re.compile(r"^(?:E\s+)?(?:SyntaxError|IndentationError|TabError)\b")
_EXCEPTION = re.compile(r"^(?:E\s+)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)):(?:\s|$)")
_UNITTEST = re.compile(r"^FAILED \((?:failures|errors)=\d")
_PYTEST = re.compile(r"^(?:FAILED|ERROR) \S")
_SHELL_SYNTAX = re.compile(
    r"^\S*\b(?:sh|bash|dash|zsh): (?:-c: )?(?:line )?\d*:? ?"
    r"(?:syntax error|Syntax error|unexpected EOF while looking for matching)"
)
_TOOL_ERROR = re.compile(
    r"^(?:[\w./-]+: )?(?:error|Error|ERROR|fatal|FATAL)(?:\[\w+\])?:|"
    r"(?:command not found|No such file or directory)\s*$"
)
_PATCH = re.compile(
    r"malformed patch|corrupt patch|patch does not apply|patch failed|Hunk #\d+ FAILED|\d+ out of \d+ hunks? FAILED"
    r"|can't find file to patch|Only garbage was found in the patch input|Invalid patch"
)
_EXIT = re.compile(
    r"<returncode>\s*(-?\d+)\s*</returncode>|\bexit(?:ed with)? (?:code|status):? ?(-?\d+)",
    re.I,
)
_TAG_LINE = re.compile(r"^</?[\w-]+>$")


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed tool output: which rule found it, and its line (the key is its start)."""

    kind: str  # traceback | syntax-error | exception | unittest | pytest | shell-syntax
    # | tool-error | patch | exit-code
    line: str
    exit_code: int | None = None
    where: str | None = None  # a syntax error's ``File "x", line N``

    @property
    def key(self) -> str:
        return failure_key(self.line)


def failure_key(line: str) -> str:
    """What a context must hold to keep a failure line (see the module's rule)."""
    text = normalize(line)
    if re.match(r"^E\s", text):
        text = text[1:].lstrip()
    return text[:KEY_CHARS]


def exit_code(output: str) -> int | None:
    """The exit status an output reports, the last one; None when it says none."""
    codes = [int(a or b) for a, b in _EXIT.findall(output)]
    return codes[-1] if codes else None


def error_lines(output: str) -> list[tuple[str, str]]:
    """Every error line of an output, in order, with the rule that found it."""
    return [(kind, line) for kind, line, _ in _error_lines(output)]


def _error_lines(output: str) -> list[tuple[str, str, str | None]]:
    """Every error line of an output, in order: the rule that found it, the line, and
    (a syntax error's) where it is."""
    lines = output.splitlines()
    found: list[tuple[str, str, str | None]] = []
    in_traceback = False
    headless = False  # frames whose header a pipe cut off
    frame: str | None = None  # the last ``File "x", line N`` seen, and how far back
    since_frame = 0
    for line in lines:
        since_frame += 1
        if _FRAME_LINE.match(line):
            frame = re.sub(r"^E\s", "", line).strip()
            since_frame = 0
            if not in_traceback:
                in_traceback = headless = True
            continue
        if _TRACEBACK.match(line):
            in_traceback, headless = True, False
            continue
        where = frame if frame is not None and since_frame <= 4 else None
        if _SYNTAX.match(line):
            in_traceback = False
            found.append(("syntax-error", line, where))
            continue
        if in_traceback:
            if not line.strip() or line[:1].isspace():
                continue
            in_traceback = False
            if headless and not _NAMED.match(line):
                pass  # frames quoted in some text, not a traceback's end
            elif not _TAG_LINE.match(line.strip()):  # an elided output's tag, not the error
                found.append(("traceback", line, None))
                continue
        if _EXCEPTION.match(line):
            found.append(("exception", line, None))
        elif _UNITTEST.match(line):
            found.append(("unittest", line, None))
        elif _SHELL_SYNTAX.match(line):
            found.append(("shell-syntax", line, None))
        elif _PYTEST.match(line):
            found.append(("pytest", line, None))
        elif _PATCH.search(line):
            found.append(("patch", line, None))
        elif _TOOL_ERROR.search(line):
            found.append(("tool-error", line, None))
    return found


def _searched(command: str | None) -> bool:
    """Whether the command's last simple command is a search or a comparison."""
    if not command:
        return False
    last = _last_command(command)
    while last and re.fullmatch(r"[A-Za-z_]\w*=.*", last[0], re.S):
        last = last[1:]
    return bool(last) and posixpath.basename(last[0]) in _SEARCHES


def failure_of(
    output: str, command: str | None = None, *, is_error: bool = False
) -> Failure | None:
    """The failure a tool output shows, or None (see the module's rule)."""
    code = exit_code(output)
    lines = _error_lines(output)
    if lines:
        kind, line, where = lines[-1]
        return Failure(kind, line, code, where)
    failed = (code is not None and code != 0) or is_error
    if not failed:
        return None
    if code == 1 and _searched(command):
        return None
    rest = [
        line
        for line in output.splitlines()
        if line.strip() and not _TAG_LINE.match(line.strip()) and not _EXIT.search(line)
    ]
    if rest:
        return Failure("exit-code", rest[-1], code)
    if command:
        return Failure("exit-code", command.strip().splitlines()[0], code)
    return None


def failure_kept(failure: Failure, text: str) -> bool:
    """Whether ``text`` (whitespace-normalized) holds the failure's key (and where a
    syntax error is)."""
    return failure.key in text and (failure.where is None or normalize(failure.where) in text)
