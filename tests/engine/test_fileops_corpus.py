"""The tables of the tools and shell commands whose files count (fileops.FILE_TOOLS,
shell.SHELL_COMMANDS) against their corpus: every row's examples are of that row and
read and modify the files they say, commands and tools of no row touch no file, and no
table names a row, a tool or a program twice."""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pytest

from app.engine.compaction.fileops import (
    FILE_TOOLS,
    FileOps,
    ToolExample,
    ToolShape,
    collect,
    shell_ops,
)
from app.engine.compaction.shell import (
    SHELL_COMMANDS,
    CommandShape,
    Example,
    program_argv,
    simple_commands,
)
from app.engine.model import Entry


def test_the_tables_name_each_row_tool_and_program_once() -> None:
    for names in ([r.name for r in FILE_TOOLS], [r.name for r in SHELL_COMMANDS]):
        assert len(names) == len(set(names))
    tools = [t for row in FILE_TOOLS for t in row.tools]
    assert len(tools) == len(set(tools))
    programs = [p for row in SHELL_COMMANDS for p in row.programs]
    assert len(programs) == len(set(programs))
    assert all(row.examples for row in FILE_TOOLS)
    assert all(row.examples for row in SHELL_COMMANDS)


# --- Shell commands -------------------------------------------------------------------------


def shell_examples() -> list[Any]:
    return [
        pytest.param(row, example, id=f"{row.name}: {example.command[:40]}")
        for row in SHELL_COMMANDS
        for example in row.examples
    ]


@pytest.mark.parametrize(("row", "example"), shell_examples())
def test_each_shell_command_reads_and_modifies_what_its_example_says(
    row: CommandShape, example: Example
) -> None:
    programs = [
        posixpath.basename(argv[0])
        for c in simple_commands(example.command)
        if (argv := program_argv(c.argv))
    ]
    assert programs[-1] in row.programs
    assert shell_ops(example.command) == FileOps(example.read, example.modified)
    # In the same shape, the same after a cd (relative to it).
    moved = shell_ops(f"cd /w && {example.command}")
    assert moved == FileOps(
        tuple(f"/w/{p}" for p in example.read), tuple(f"/w/{p}" for p in example.modified)
    )


TOUCHING_NOTHING = [
    "ls -la",
    "find . -name '*.py'",
    "python -m pytest tests",
    "grep -rn foo src",
    "rm -rf build",
    "cp -r src dest",
    "echo hello",
    "xargs cat",
    "git status",
    "sed -e 's/a/b/'",
    "cat",
    "head -n 5",
    "mv a.py",
    "cp a.py backup",
    "perl -e 'print 1' a.py",
    "tee",
    "cat $FILE",
    "wc -l *.py",
    "cat /dev/null",
    "",
]


@pytest.mark.parametrize("command", TOUCHING_NOTHING)
def test_commands_of_no_row_or_no_plain_file_touch_nothing(command: str) -> None:
    assert shell_ops(command) == FileOps()


# --- Structured tools -----------------------------------------------------------------------


def tool_examples() -> list[Any]:
    return [
        pytest.param(row, example, id=f"{row.name}: {example.tool}")
        for row in FILE_TOOLS
        for example in row.examples
    ]


def call(tool: str, arguments: Any) -> Entry:
    part = {"type": "tool_call", "id": "c1", "name": tool, "arguments": json.dumps(arguments)}
    return Entry(role="assistant", parts=[part])


@pytest.mark.parametrize(("row", "example"), tool_examples())
def test_each_tool_reads_and_modifies_what_its_example_says(
    row: ToolShape, example: ToolExample
) -> None:
    assert example.tool.lower().rsplit("__", 1)[-1].replace("-", "_") in row.tools
    assert collect([call(example.tool, example.arguments)]) == FileOps(
        example.read, example.modified
    )


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("search", {"path": "src/a.py", "query": "x"}),
        ("list_dir", {"path": "src"}),
        ("web_fetch", {"url": "https://example.com/a.py"}),
        ("read_file", {"path": "src/*.py"}),
        ("write_file", {"path": "src/"}),
        ("str_replace_based_edit_tool", {"command": "undo", "path": "a.py"}),
        ("bash", {"command": "ls"}),
    ],
)
def test_tools_of_no_row_or_no_plain_file_touch_nothing(tool: str, arguments: Any) -> None:
    assert collect([call(tool, arguments)]) == FileOps()
