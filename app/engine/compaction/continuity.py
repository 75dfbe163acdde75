"""The continuity gate (docs/how-it-works.md, "The continuity gate"): before a summary is
committed, does the context it makes still name what the agent needs to go on? Pure:
text and plain values in, plain values out.

What must be named (:class:`Anchors`: the task's key terms, every modified file, the
latest unresolved error), where it may be named (the summary or the kept window's
text, :func:`kept_text`), when a thing counts as named (:func:`check`) and how the
``<continuity-anchors>`` block completes a summary (:func:`complete`) are specified in
docs/compaction-heuristics.md, "What the continuity gate checks".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.model import Entry

MAX_TERMS = 200  # task terms checked, at most
ERROR_KEY_CHARS = 120  # how much of the error line must be quoted
ERROR_LINE_CHARS = 200  # how much of it the block quotes
LABEL_CHARS = 160
# The block's cap: a quarter of the summary's size, and at least this.
MIN_BLOCK_CHARS = 600
BLOCK_SHARE = 4

BLOCK_OPEN = "<continuity-anchors>"
BLOCK_CLOSE = "</continuity-anchors>"
BLOCK_INTRO = "Not named above, and needed to go on with the work:"
ERROR_LABEL = "Unresolved error:"
FILES_LABEL = "Files modified:"
TERMS_LABEL = "Task terms to keep:"
_BLOCK = re.compile(r"[ \t]*<continuity-anchors>.*?</continuity-anchors>[ \t]*(?:\n|\Z)", re.S)
_BLANK_RUNS = re.compile(r"\n{3,}")


@dataclass(frozen=True, slots=True)
class UnresolvedError:
    """The latest unresolved error: its line as the output wrote it (indentation
    stripped), and the command that produced it on one line (empty when unknown);
    ``also``, the lines it is quoted with (the output's last error line, a syntax
    error's location: :attr:`app.engine.compaction.anchors.ErrorAnchor.also`), which must
    be named too (the details carry them, when there are some, for the next compaction)."""

    line: str
    command: str = ""
    also: tuple[str, ...] = ()

    def to_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"line": self.line, "command": self.command}
        if self.also:
            details["also"] = list(self.also)
        return details

    @classmethod
    def from_details(cls, value: Any) -> UnresolvedError | None:
        if not isinstance(value, Mapping):
            return None
        line, command, also = value.get("line"), value.get("command"), value.get("also")
        if not isinstance(line, str) or not line.strip():
            return None
        lines = (
            tuple(x for x in also if isinstance(x, str) and x.strip())
            if isinstance(also, list)
            else ()
        )
        return cls(line, command if isinstance(command, str) else "", lines)

    def shown(self) -> str:
        """As the block quotes it: the line and those it is quoted with (each clipped
        only beyond :data:`ERROR_LINE_CHARS`, its start kept) and the command after it."""
        line = ALSO_SEPARATOR.join(_clipped(x) for x in (self.line, *self.also) if x.strip())
        if not self.command:
            return line
        command = " ".join(self.command.split())
        if len(command) > LABEL_CHARS:
            command = command[: LABEL_CHARS - 1].rstrip() + "…"
        return f"{line} — after {_code(command)}"


ALSO_SEPARATOR = " · "


def _clipped(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= ERROR_LINE_CHARS else line[: ERROR_LINE_CHARS - 1].rstrip() + "…"


@dataclass(frozen=True, slots=True)
class Anchors:
    """What the context after a compaction must name."""

    terms: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    error: UnresolvedError | None = None
    workdir: str | None = None

    def to_details(self) -> dict[str, Any]:
        return {
            "terms": len(self.terms),
            "files": len(self.files),
            "error": self.error.line if self.error is not None else None,
        }


@dataclass(frozen=True, slots=True)
class Missing:
    """Anchors not named: terms and files in their anchors' order."""

    terms: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    error: UnresolvedError | None = None

    @property
    def empty(self) -> bool:
        return not self.terms and not self.files and self.error is None

    @property
    def count(self) -> int:
        return len(self.terms) + len(self.files) + (self.error is not None)

    def items(self) -> list[str]:
        """Each missing thing as the block and the retry prompt show it, error first."""
        return [
            *([self.error.shown()] if self.error is not None else []),
            *self.files,
            *(_code(t) for t in self.terms),
        ]

    def without(self, other: Missing) -> Missing:
        """These, less ``other``'s."""
        drop_terms, drop_files = set(other.terms), set(other.files)
        return Missing(
            tuple(t for t in self.terms if t not in drop_terms),
            tuple(f for f in self.files if f not in drop_files),
            None if other.error is not None else self.error,
        )

    def to_details(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "files": list(self.files),
            "error": self.error.line if self.error is not None else None,
        }


NOTHING = Missing()


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# --- Reading ---------------------------------------------------------------------------


def _argument_text(arguments: Any) -> str:
    """A tool call's argument values, as text (the strings of its JSON, unescaped)."""
    if not isinstance(arguments, str) or not arguments.strip():
        return ""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk(value)
    return "\n".join(out)


def kept_text(entries: Iterable[Entry]) -> str:
    """The text of the kept window the gate reads (docs/compaction-heuristics.md)."""
    pieces: list[str] = []
    for entry in entries:
        if entry.role == "tool":
            continue
        text = entry.text()
        if text:
            pieces.append(text)
        for part in entry.tool_calls():
            pieces.append(str(part.get("name") or ""))
            pieces.append(_argument_text(part.get("arguments")))
    return "\n".join(p for p in pieces if p)


def _normalized(text: str) -> str:
    return " ".join(text.split())


def error_key(line: str) -> str:
    """What of an error line must be quoted (docs/compaction-heuristics.md)."""
    return _normalized(line)[:ERROR_KEY_CHARS].rstrip("…").rstrip()


_PATH_CHAR = re.compile(r"[\w\-/]")
_BEFORE = re.compile(r"[\w\-./]")


def _bounded(text: str, path: str, allowed_prefixes: Sequence[str]) -> bool:
    start = text.find(path)
    while start >= 0:
        end = start + len(path)
        ok_before = start == 0 or not _BEFORE.match(text[start - 1])
        if not ok_before:
            ok_before = any(
                text.endswith(prefix, 0, start)
                and (start == len(prefix) or not _BEFORE.match(text[start - len(prefix) - 1]))
                for prefix in allowed_prefixes
            )
        after = text[end : end + 2]
        ok_after = not after or (
            not _PATH_CHAR.match(after[0])
            and not (after[0] == "." and len(after) > 1 and _PATH_CHAR.match(after[1]))
        )
        if ok_before and ok_after:
            return True
        start = text.find(path, start + 1)
    return False


def file_named(path: str, text: str, workdir: str | None = None) -> bool:
    """Whether ``text`` names ``path`` (docs/compaction-heuristics.md)."""
    root = workdir.rstrip("/") + "/" if workdir else None
    prefixes = ["./", *([root] if root else [])]
    if _bounded(text, path, prefixes):
        return True
    if root is not None and path.startswith(root) and len(path) > len(root):
        return _bounded(text, path[len(root) :], prefixes)
    return False


def check(summary: str, kept: str, anchors: Anchors) -> Missing:
    """What of ``anchors`` neither ``summary`` nor the kept window's text names."""
    text = f"{summary}\n{kept}"
    terms = tuple(t for t in anchors.terms if t not in text)
    files = tuple(f for f in anchors.files if not file_named(f, text, anchors.workdir))
    error = anchors.error
    if error is not None:
        normalized = _normalized(text)
        if all(error_key(x) in normalized for x in (error.line, *error.also) if x.strip()):
            error = None
    return Missing(terms, files, error)


# --- Completing --------------------------------------------------------------------------


def block_chars(max_chars: int) -> int:
    """The block's cap for a summary of ``max_chars``."""
    return max(MIN_BLOCK_CHARS, max_chars // BLOCK_SHARE)


def render_block(missing: Missing) -> str:
    """The ``<continuity-anchors>`` block naming ``missing``; empty when nothing is."""
    if missing.empty:
        return ""
    lines = [BLOCK_OPEN, BLOCK_INTRO]
    if missing.error is not None:
        lines.append(f"{ERROR_LABEL} {missing.error.shown()}")
    if missing.files:
        lines.append(FILES_LABEL)
        lines += missing.files
    if missing.terms:
        lines.append(f"{TERMS_LABEL} " + ", ".join(_code(t) for t in missing.terms))
    lines.append(BLOCK_CLOSE)
    return "\n".join(lines)


def strip_block(summary: str) -> str:
    """``summary`` without any ``<continuity-anchors>`` block."""
    if BLOCK_OPEN not in summary:
        return summary.strip()
    return _BLANK_RUNS.sub("\n\n", _BLOCK.sub("", summary)).strip()


def _ordered(missing: Missing) -> list[Missing]:
    """Each missing thing on its own, in the order the block keeps them: error, files, terms."""
    return [
        *([Missing(error=missing.error)] if missing.error is not None else []),
        *(Missing(files=(f,)) for f in missing.files),
        *(Missing(terms=(t,)) for t in missing.terms),
    ]


def _union(parts: Iterable[Missing]) -> Missing:
    terms: list[str] = []
    files: list[str] = []
    error: UnresolvedError | None = None
    for p in parts:
        terms += p.terms
        files += p.files
        error = p.error or error
    return Missing(tuple(terms), tuple(files), error)


@dataclass(frozen=True, slots=True)
class Completion:
    """A summary with its block: what the block names (``added``) and what the cap
    left out (``left``)."""

    summary: str
    added: Missing = field(default_factory=Missing)
    left: Missing = field(default_factory=Missing)


def complete(compose: Callable[[str], str], missing: Missing, max_chars: int) -> Completion:
    """The summary ``compose`` makes with a block naming ``missing``, as much of it
    as fits in ``max_chars`` characters (the error first, then the files, then the
    terms; an item that does not fit is left out, the next tried). ``compose(block)``
    puts the block in the summary (``""``: none). Every item the block holds is
    named by the summary; of those left out, some may happen to be named by the
    block's other items (:func:`check` says what is still missing)."""
    kept: list[Missing] = []
    left: list[Missing] = []
    for item in _ordered(missing):
        if len(render_block(_union([*kept, item]))) <= max_chars:
            kept.append(item)
        else:
            left.append(item)
    added = _union(kept)
    return Completion(compose(render_block(added)), added, _union(left))


def fit(
    compose: Callable[[str], str],
    completion: Completion,
    max_tokens: int,
    count: Callable[[str], int],
) -> Completion:
    """``completion`` with the fewest of its block's items dropped (the terms first,
    then the files, the error last) for ``count(summary)`` to be at most
    ``max_tokens``; the dropped ones join ``left``. With nothing left to drop, the
    summary without a block (which may still be over)."""
    items = _ordered(completion.added)

    def with_first(k: int) -> Completion:
        added = _union(items[:k])
        dropped = _union(items[k:])
        left = _union([dropped, completion.left])
        return Completion(compose(render_block(added)), added, left)

    if count(completion.summary) <= max_tokens:
        return completion
    # The longest prefix that fits: a block with more items is never shorter.
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(with_first(mid).summary) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return with_first(lo)


# --- Recording -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateRecord:
    """What the gate found for one summary, for the job's details."""

    checked: Anchors
    missing_before: Missing
    retried: bool = False
    retry_missing: Missing | None = None  # what the retried summary missed
    retry_error: str | None = None  # why the retry gave nothing
    completed: Missing = NOTHING
    trimmed: Missing = NOTHING  # dropped from the block for the compaction to save tokens
    missing_after: Missing = NOTHING

    def to_details(self) -> dict[str, Any]:
        return {
            "checked": self.checked.to_details(),
            "missing_before": self.missing_before.to_details(),
            "retried": self.retried,
            "retry_missing": (
                self.retry_missing.to_details() if self.retry_missing is not None else None
            ),
            "retry_error": self.retry_error,
            "completed": self.completed.to_details(),
            "trimmed": self.trimmed.to_details(),
            "missing_after": self.missing_after.to_details(),
        }

    def refit(self, completion: Completion, missing_after: Missing) -> GateRecord:
        """This record once ``completion`` (a :func:`fit` of what it completed) is
        used, which leaves ``missing_after`` unnamed."""
        trimmed = self.completed.without(completion.added)
        return replace(
            self,
            completed=completion.added,
            trimmed=_union([self.trimmed, trimmed]),
            missing_after=missing_after,
        )


# --- The task's terms and the working directory --------------------------------------------

_WORKDIR_PHRASE = re.compile(
    r"working directory|current directory|working dir\b|\bcwd\b|\bworkdir\b", re.I
)
_ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:[\w.+@-]+/)*[\w.+@-]+/?")


# A line that states the working directory is a line of a prompt, not a megabyte: longer
# ones are not read. One regular-expression scan holds the GIL (and so the service's event
# loop, even from a worker thread) as long as it runs: a second for a 7.5 MB message.
MAX_STATED_LINE = 4096


def stated_workdir(texts: Iterable[str]) -> str | None:
    """The working directory ``texts`` state, or None: an absolute path on a line
    (of at most ``MAX_STATED_LINE`` characters) that says "working directory" (or
    "current directory", "cwd", "workdir"), the only such path on that line; None
    when two lines state different ones."""
    found: set[str] = set()
    for text in texts:
        lowered = text.lower()
        if "dir" not in lowered and "cwd" not in lowered:  # every phrase has one of them
            continue
        for line in text.splitlines():
            if len(line) > MAX_STATED_LINE or not _WORKDIR_PHRASE.search(line):
                continue
            paths = {p.rstrip("/.") for p in _ABSOLUTE.findall(line)}
            paths.discard("")
            if len(paths) == 1:
                found |= paths
    return found.pop() if len(found) == 1 else None


def dedupe_under(paths: Sequence[str], others: Iterable[str], workdir: str | None) -> list[str]:
    """``paths`` without an absolute path under ``workdir`` whose relative form is in
    ``paths`` or ``others`` (the same file, named twice); unchanged without one."""
    if not workdir:
        return list(paths)
    root = workdir.rstrip("/") + "/"
    relative = set(paths) | set(others)
    return [p for p in paths if not (p.startswith(root) and p[len(root) :] in relative)]
