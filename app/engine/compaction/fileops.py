"""Which files the agent read and modified, for the summary (docs/how-it-works.md,
"Compaction").

A summary ends with the files the agent has read and modified so far, so the
model keeps track of them after the details are gone. :func:`collect` finds
them in the assistants' tool calls and adds them to those of the previous
compaction (kept in its details), so the lists grow across compactions. A file
both read and modified is listed as modified only.

Tools are recognized by name, case-insensitive (an MCP prefix such as
``mcp__fs__`` is ignored):

- read tools (``read``, ``read_file``, ``view``, ``cat``, ``open_file``, ...),
  write tools (``write``, ``write_file``, ``create_file``, ``create``) and edit
  tools (``edit``, ``edit_file``, ``multiedit``, ``str_replace``,
  ``replace_in_file``, ...) name their file in one of the usual argument keys
  (``path``, ``file_path``, ``filePath``, ``filename``, ``file``,
  ``target_file``, ``absolute_path``, or a ``paths`` list);
- Anthropic's text editor (``str_replace_based_edit_tool``,
  ``str_replace_editor``) says what it does in ``command``: ``view`` reads,
  ``create``, ``str_replace``, ``insert`` and ``undo_edit`` modify;
- patch tools (``apply_patch``, ``patch``) modify every file their patch names,
  in the ``*** Update/Add/Delete File:`` form or as unified-diff ``+++`` headers;
- shell tools (``bash``, ``shell``, ``run_terminal_cmd``, ``execute_command``,
  ...) run a command line (or an argv): :mod:`app.engine.compaction.shell` reads it the way a
  shell splits it and says which of its files count (plain cases only: ``cat``,
  ``sed -i``, redirections, ``tee``, ``mv``, a patch fed to ``git apply`` or
  ``patch``, ``git checkout -- f``, and the files Python code opens for writing, be it
  ``python -c``, a here-document or a script file written earlier in the history).

The calls are read in order, and what a write tool or a here-document puts in a file
is remembered while they are, so that ``python fix.py`` or ``git apply fix.patch``
later in the same history is credited with the files that script or patch writes.

Being wrong is worse than missing a file: arguments that are not valid JSON are
ignored, and a path sent as JSON is taken as it is written (spaces included) unless
it is a glob, ends with ``/`` or holds a control character. Paths are normalized
(``./a/../b.py`` is ``b.py``), not resolved against any working directory the
command did not state.
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

READ_TOOLS = frozenset(
    {"read", "read_file", "readfile", "view", "view_file", "cat", "open_file", "read_many_files"}
)
WRITE_TOOLS = frozenset({"write", "write_file", "create_file", "create"})
EDIT_TOOLS = frozenset(
    {
        "edit",
        "edit_file",
        "multiedit",
        "multi_edit",
        "str_replace",
        "replace",
        "replace_in_file",
        "search_replace",
    }
)
PATCH_TOOLS = frozenset({"apply_patch", "applypatch", "patch"})
EDITOR_TOOLS = frozenset({"str_replace_based_edit_tool", "str_replace_editor"})
EDITOR_MODIFIES = frozenset({"create", "str_replace", "insert", "undo_edit"})
SHELL_TOOLS = frozenset(
    {
        "bash",
        "shell",
        "sh",
        "run_terminal_cmd",
        "execute_command",
        "exec",
        "terminal",
        "run_command",
        "run_shell_command",
        "execute_bash",
        "local_shell",
    }
)
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
    if tool in EDITOR_TOOLS:
        command = args.get("command")
        if command == "view":
            found.read.update(_argument_paths(args))
        elif command in EDITOR_MODIFIES or (command is None and tool == "str_replace_editor"):
            found.modified.update(_argument_paths(args))
            if command == "create":
                _remember(args, found)
    elif tool in READ_TOOLS:
        found.read.update(_argument_paths(args))
    elif tool in WRITE_TOOLS or tool in EDIT_TOOLS:
        found.modified.update(_argument_paths(args))
        if tool in WRITE_TOOLS:
            _remember(args, found)
    elif tool in PATCH_TOOLS:
        found.modified.update(_argument_paths(args))
        for value in args.values():
            if isinstance(value, str):
                found.modified.update(patch_paths(value))
    elif tool in SHELL_TOOLS:
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
