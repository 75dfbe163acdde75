"""Ingest truncation of tool results by output category (docs/how-it-works.md,
"Accounting, verdicts and pruning", ingest truncation).

A tool result longer than a token cap is cut before it reaches the model's
view. The cap uses the same ``chars / 4`` approximation as the seed, so the
budget is ``cap_tokens * 4`` characters; this module never calls a tokenizer,
because it runs on every tool result and must stay fast on megabyte outputs.

How a result is cut depends on the shape of its output:

- ``head_tail`` (shells): the first 60 and last 40 lines, the command preamble
  and the final result; shrunk proportionally when those lines are too long.
- ``match_list`` (search and listing tools): the leading whole lines only.
- ``file_content`` (file readers): half the budget for the head, half for the tail.
- ``generic``: a hard cut at the last line boundary within the budget.

A single line too long for its share is cut by characters. A truncated result
carries one notice, ``[... N lines / B bytes omitted ...]``, where the gap is
(between head and tail, or at the end). ``N`` counts the lines not shown in
full, ``B`` the UTF-8 bytes left out. The notice is reserved inside the budget,
so a result never exceeds it by more than the notice's length.

Only bounded slices are searched with ``str`` methods; the omitted middle of a
large output is never split into lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Category = Literal["head_tail", "match_list", "file_content", "generic"]
CATEGORIES: tuple[Category, ...] = ("head_tail", "match_list", "file_content", "generic")

CHARS_PER_TOKEN = 4
DEFAULT_CAP_TOKENS = 4_000
HEAD_LINES = 60
TAIL_LINES = 40

_HEAD_TAIL = (
    "bash",
    "shell",
    "sh",
    "zsh",
    "fish",
    "powershell",
    "pwsh",
    "cmd",
    "terminal",
    "local_shell",
    "run_terminal_command",
    "run_terminal_cmd",
    "run_in_terminal",
    "run_shell_command",
    "shell_command",
    "execute_bash",
    "run_command",
    "execute_command",
    "exec",
    "command",
    "run",
    "python",
    "ipython",
    "run_python",
    "code_interpreter",
    "gdb_command",
    "gdb_interrupt",
    "gdb_wait_stopped",
)
_MATCH_LIST = (
    "grep",
    "rg",
    "ripgrep",
    "search",
    "search_codebase",
    "codebase_search",
    "semantic_search",
    "grep_search",
    "file_search",
    "search_files",
    "find",
    "find_files",
    "glob",
    "ls",
    "list_files",
    "list_dir",
    "list_directory",
    "directory_tree",
    "tree",
    "read_lints",
    "get_errors",
    "web_search",
)
_FILE_CONTENT = (
    "read",
    "read_file",
    "read_text_file",
    "file_read",
    "view",
    "view_file",
    "cat",
    "open",
    "open_file",
    "fs",
    "get_file_contents",
    "str_replace_based_edit_tool",
    "str_replace_editor",
    "text_editor",
)


def _defaults() -> dict[str, Category]:
    by_name: dict[str, Category] = {}
    by_name.update((name, "head_tail") for name in _HEAD_TAIL)
    by_name.update((name, "match_list") for name in _MATCH_LIST)
    by_name.update((name, "file_content") for name in _FILE_CONTENT)
    return by_name


DEFAULT_CATEGORIES: Mapping[str, Category] = MappingProxyType(_defaults())

_BY_VALUE: dict[str, Category] = {category: category for category in CATEGORIES}
_NAMESPACE_SEPARATORS = ("__", ".", "/")


def category_for(tool_name: str | None, overrides: Mapping[str, str] | None = None) -> Category:
    """The output category of a tool, by name.

    Overrides win (exact name, then lower-case), then the defaults by lower-cased
    name; a namespaced name (``mcp__fs__read_file``, ``functions.bash``) falls back
    to its last segment. Unknown names, and override values that are not a
    category, are ``generic``.
    """
    if not tool_name:
        return "generic"
    found = _lookup(tool_name, overrides)
    if found is None:
        segment = _last_segment(tool_name)
        if segment and segment != tool_name:
            found = _lookup(segment, overrides)
    return found or "generic"


def _lookup(name: str, overrides: Mapping[str, str] | None) -> Category | None:
    lower = name.lower()
    if overrides:
        for key in (name, lower):
            if key in overrides:
                # The caller validates overrides; anything else still must not crash.
                return _BY_VALUE.get(str(overrides[key]), "generic")
    return DEFAULT_CATEGORIES.get(lower)


def _last_segment(name: str) -> str:
    cut = max(name.rfind(sep) + len(sep) if sep in name else 0 for sep in _NAMESPACE_SEPARATORS)
    return name[cut:]


@dataclass(frozen=True, slots=True)
class Truncation:
    text: str  # what the model sees
    omitted_lines: int  # lines not shown in full
    omitted_bytes: int  # UTF-8 bytes left out (0 when not truncated)

    @property
    def truncated(self) -> bool:
        return self.omitted_bytes > 0


def truncate(text: str, category: Category, cap_tokens: int) -> Truncation:
    """Cut ``text`` to about ``cap_tokens`` (at ``chars / 4``) the way ``category``
    says. Text within the budget, or any text when ``cap_tokens <= 0``, comes back
    unchanged (the same object)."""
    budget = cap_tokens * CHARS_PER_TOKEN
    n = len(text)
    if cap_tokens <= 0 or n <= budget:
        return Truncation(text, 0, 0)
    kept = _kept_budget(budget, n)
    if category == "head_tail":
        head, tail = _head_and_tail(text, kept, HEAD_LINES, TAIL_LINES, kept * 3 // 5)
    elif category == "file_content":
        head, tail = _head_and_tail(text, kept, None, None, kept // 2)
    elif category == "match_list":
        head, tail = _prefix(text, kept, min_fraction=0.0), n
    else:
        head, tail = _prefix(text, kept, min_fraction=0.5), n
    return _render(text, head, tail)


def _kept_budget(budget: int, n: int) -> int:
    """Characters left for the kept text once the longest possible notice is reserved;
    never less than half the budget, so tiny caps still show something."""
    reserve = len(_notice(n, CHARS_PER_TOKEN * n)) + 2  # plus a newline either side
    return max(budget - reserve, budget // 2)


def _head_and_tail(
    text: str, kept: int, head_lines: int | None, tail_lines: int | None, head_share: int
) -> tuple[int, int]:
    """Head end and tail start. The head takes up to its share first, the tail the
    rest, then the head takes back what the tail could not use. ``kept < len(text)``,
    so the two never meet."""
    n = len(text)
    head = _prefix_end(text, head_lines, head_share) or _char_cut(text, head_share)
    tail = _suffix_start(text, tail_lines, kept - head)
    if tail == n:
        tail = _char_cut_tail(text, n - (kept - head))
    head = max(head, _prefix_end(text, head_lines, kept - (n - tail)))
    if text.count("\n", 0, head) == 0:  # a cut inside the first line may grow too
        head = max(head, _char_cut(text, kept - (n - tail)))
    return head, tail


def _prefix(text: str, kept: int, min_fraction: float) -> int:
    """End of the leading whole lines within ``kept``; by characters when no line
    fits or the last line boundary would keep less than ``min_fraction`` of it."""
    end = _prefix_end(text, None, kept)
    if end == 0 or end < kept * min_fraction:
        end = _char_cut(text, kept)
    return end


def _prefix_end(text: str, max_lines: int | None, max_chars: int) -> int:
    """The longest prefix made of whole lines (each with its newline), at most
    ``max_lines`` of them and ``max_chars < len(text)`` characters; 0 when none fits."""
    if max_lines is None:
        return text.rfind("\n", 0, max_chars) + 1
    end = 0
    for _ in range(max_lines):
        newline = text.find("\n", end, max_chars)
        if newline < 0:
            break
        end = newline + 1
    return end


def _suffix_start(text: str, max_lines: int | None, max_chars: int) -> int:
    """Start of the longest suffix made of whole lines, at most ``max_lines`` of them
    and ``max_chars < len(text)`` characters; ``len(text)`` when none fits."""
    n = len(text)
    lowest = n - max_chars - 1  # the newline before the suffix is at this index or later
    if max_lines is None:
        return text.find("\n", lowest) + 1 or n
    start = n
    search_end = n - 1 if text.endswith("\n") else n  # the final newline ends the last line
    for _ in range(max_lines):
        newline = text.rfind("\n", lowest, search_end)
        if newline < 0:
            break
        start = newline + 1
        search_end = newline
    return start


def _char_cut(text: str, end: int) -> int:
    """A head cut by characters at ``end``, not between a CR and its LF."""
    if 0 < end < len(text) and text[end] == "\n" and text[end - 1] == "\r":
        end -= 1
    return max(end, 0)


def _char_cut_tail(text: str, start: int) -> int:
    """A tail cut by characters at ``start``, not between a CR and its LF."""
    if 0 < start < len(text) and text[start] == "\n" and text[start - 1] == "\r":
        start += 1
    return start


def _render(text: str, head_end: int, tail_start: int) -> Truncation:
    """The kept head, the notice where the gap is, and the kept tail."""
    lines = text.count("\n", head_end, tail_start - 1) + 1
    if text.isascii():  # O(1) in CPython: spares encoding a megabyte to count it
        omitted_bytes = tail_start - head_end
    else:
        omitted_bytes = len(text[head_end:tail_start].encode("utf-8", "surrogatepass"))
    head, tail = text[:head_end], text[tail_start:]
    before = "\n" if head and not head.endswith("\n") else ""
    after = "\n" if tail else ""
    notice = _notice(lines, omitted_bytes)
    return Truncation(f"{head}{before}{notice}{after}{tail}", lines, omitted_bytes)


def _notice(lines: int, omitted_bytes: int) -> str:
    unit = "line" if lines == 1 else "lines"
    return f"[... {lines} {unit} / {omitted_bytes} bytes omitted ...]"
