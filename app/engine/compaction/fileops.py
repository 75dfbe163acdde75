"""Which files the agent read and modified, for the summary.

A summary ends with the files the agent has read and modified so far, so the model
keeps track of them after the details are gone. :func:`collect` finds them in the
assistants' tool calls and adds them to those of the previous compaction (kept in its
details); a file both read and modified is listed as modified only. The tools whose
files count are the rows of :data:`FILE_TOOLS` (shell tools' command lines are read by
:mod:`app.engine.compaction.shell`). The rules are specified in
docs/compaction-heuristics.md, "Files read and modified".
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.compaction.shell import Found, add_argv, add_script, patch_paths
from app.engine.model import Entry

__all__ = ["FileOps", "collect", "patch_paths", "shell_ops"]


@dataclass(frozen=True, slots=True)
class FileOps:
    """Files read and modified, each sorted and without duplicates; a file both read
    and modified is in ``modified`` only (the constructor enforces it)."""

    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        modified = frozenset(self.modified)
        object.__setattr__(self, "modified", tuple(sorted(modified)))
        object.__setattr__(self, "read", tuple(sorted(set(self.read) - modified)))

    @classmethod
    def of(cls, read: Iterable[str] = (), modified: Iterable[str] = ()) -> FileOps:
        return cls(tuple(read), tuple(modified))

    @classmethod
    def from_details(cls, details: Mapping[str, Any] | None) -> FileOps:
        """The file lists stored in a compaction's details; anything malformed is skipped."""

        def strings(key: str) -> list[str]:
            value = details.get(key) if details is not None else None
            return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []

        return cls.of(strings("read_files"), strings("modified_files"))

    def to_details(self) -> dict[str, list[str]]:
        return {"read_files": list(self.read), "modified_files": list(self.modified)}

    def merge(self, other: FileOps) -> FileOps:
        return FileOps.of(self.read + other.read, self.modified + other.modified)


def collect(entries: Iterable[Entry], previous: FileOps | None = None) -> FileOps:
    """The files the assistants' tool calls in ``entries`` read and modified, added to
    ``previous`` (those of the earlier compactions)."""
    found = Found()
    for entry in entries:
        if entry.role != "assistant":
            continue
        for part in entry.parts:
            if part.get("type") == "tool_call":
                _tool_call(part.get("name"), part.get("arguments"), found)
    ops = FileOps.of(found.read, found.modified)
    return previous.merge(ops) if previous is not None else ops


def shell_ops(command: str) -> FileOps:
    """What one shell command line reads and modifies (see :mod:`app.engine.compaction.shell`)."""
    found = Found()
    add_script(command, found)
    return FileOps.of(found.read, found.modified)


# --- Structured tools ---------------------------------------------------------------------

PATH_KEYS = (
    "path",
    "file_path",
    "filePath",
    "filename",
    "file",
    "target_file",
    "absolute_path",
)
COMMAND_KEYS = ("command", "cmd", "script")
EDITOR_MODIFIES = frozenset({"create", "str_replace", "insert", "undo_edit"})


@dataclass(frozen=True, slots=True)
class ToolExample:
    """A tool call (its name and arguments) and the files it reads and modifies, sorted."""

    tool: str
    arguments: Mapping[str, Any]
    read: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolShape:
    """One row of :data:`FILE_TOOLS`: the tools it covers, by name (lower case, an MCP
    prefix left out), what kind of tool they are (how their arguments are read), and
    examples of it."""

    name: str
    tools: frozenset[str]
    kind: str  # editor, read, write, edit, patch or shell
    examples: tuple[ToolExample, ...]


def _row(name: str, tools: str, kind: str, *examples: ToolExample) -> ToolShape:
    return ToolShape(name, frozenset(tools.split()), kind, examples)


# The tools whose files count (docs/compaction-heuristics.md, "Files read and modified"):
# a new one is a row, with examples that tests/engine/test_fileops_corpus.py runs.
FILE_TOOLS: tuple[ToolShape, ...] = (
    _row(
        "text-editor",
        "str_replace_based_edit_tool str_replace_editor",
        "editor",
        ToolExample(
            "str_replace_based_edit_tool", {"command": "view", "path": "a.py"}, read=("a.py",)
        ),
        ToolExample(
            "str_replace_editor",
            {"command": "str_replace", "path": "a.py", "old_str": "x", "new_str": "y"},
            modified=("a.py",),
        ),
    ),
    _row(
        "read",
        "read read_file readfile view view_file cat open_file read_many_files",
        "read",
        ToolExample("read_file", {"path": "src/a.py"}, read=("src/a.py",)),
        ToolExample("mcp__fs__read_many_files", {"paths": ["a.md", "b.md"]}, read=("a.md", "b.md")),
    ),
    _row(
        "write",
        "write write_file create_file create",
        "write",
        ToolExample("write_file", {"file_path": "out.txt", "content": "x"}, modified=("out.txt",)),
    ),
    _row(
        "edit",
        "edit edit_file multiedit multi_edit str_replace replace replace_in_file search_replace",
        "edit",
        ToolExample("Edit", {"file_path": "src/a.py", "old_string": "a"}, modified=("src/a.py",)),
    ),
    _row(
        "patch",
        "apply_patch applypatch patch",
        "patch",
        ToolExample(
            "apply_patch",
            {"input": "*** Begin Patch\n*** Add File: docs/new.md\n+hi\n*** End Patch"},
            modified=("docs/new.md",),
        ),
    ),
    _row(
        "shell",
        "bash shell sh run_terminal_cmd execute_command exec terminal run_command "
        "run_shell_command execute_bash local_shell",
        "shell",
        ToolExample("bash", {"command": "sed -i 's/a/b/' x.py"}, modified=("x.py",)),
        ToolExample("local_shell", {"command": ["cat", "a.txt"]}, read=("a.txt",)),
    ),
)
_KIND = {tool: row.kind for row in FILE_TOOLS for tool in sorted(row.tools)}


def _tool_name(name: str) -> str:
    return name.lower().rsplit("__", 1)[-1].replace("-", "_")


def _tool_call(name: object, arguments: object, found: Found) -> None:
    if not isinstance(name, str) or not isinstance(arguments, str):
        return
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return
    if not isinstance(args, dict):
        return
    tool = _tool_name(name)
    kind = _KIND.get(tool)
    if kind == "editor":
        command = args.get("command")
        if command == "view":
            found.read.update(_argument_paths(args))
        elif command in EDITOR_MODIFIES or (command is None and tool == "str_replace_editor"):
            found.modified.update(_argument_paths(args))
            if command == "create":
                _remember(args, found)
    elif kind == "read":
        found.read.update(_argument_paths(args))
    elif kind == "write" or kind == "edit":
        found.modified.update(_argument_paths(args))
        if kind == "write":
            _remember(args, found)
    elif kind == "patch":
        found.modified.update(_argument_paths(args))
        for value in args.values():
            if isinstance(value, str):
                found.modified.update(patch_paths(value))
    elif kind == "shell":
        for key in COMMAND_KEYS:
            command = args.get(key)
            if isinstance(command, str):
                add_script(command, found)
                break
            if isinstance(command, list) and all(isinstance(w, str) for w in command):
                add_argv(command, found)
                break


CONTENT_KEYS = ("file_text", "content", "contents", "text")


def _remember(args: Mapping[str, Any], found: Found) -> None:
    """The text a write tool put in its file, for a later command that runs it."""
    text = next((v for k in CONTENT_KEYS if isinstance(v := args.get(k), str)), None)
    paths = _argument_paths(args)
    if text is not None and len(paths) == 1:
        found.remember(paths[0], text)


def _argument_paths(args: Mapping[str, Any]) -> list[str]:
    values: list[object] = [args.get(key) for key in PATH_KEYS]
    paths = args.get("paths")
    if isinstance(paths, list):
        values += paths
    return [p for v in values if isinstance(v, str) and (p := _structured_path(v)) is not None]


def _structured_path(value: str) -> str | None:
    # A path sent as JSON is unambiguous, spaces included; globs and control
    # characters still mean it is not one file.
    if not value or value.endswith("/") or any(c in value for c in "*?\n\r\t\0"):
        return None
    path = posixpath.normpath(value)
    return None if path in (".", "..", "/") else path
