"""Files written by the scripts and commands an agent runs count as modified
(app/engine/compaction/shell.py, app/engine/compaction/fileops.py; issue 14)."""

from __future__ import annotations

import itertools
import json
import posixpath
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction.fileops import FileOps, collect, shell_ops
from app.engine.compaction.shell import python_writes
from app.engine.formats.openai_format import parse_message
from app.engine.model import Entry
from tests.traces import load, trace_files

PROPERTY = settings(max_examples=300, deadline=None)


def bash(*commands: str) -> list[Entry]:
    """One assistant message per command, as an agent runs them one after another."""
    return [
        Entry(
            role="assistant",
            parts=[
                {
                    "type": "tool_call",
                    "id": f"c{k}",
                    "name": "bash",
                    "arguments": json.dumps({"command": command}),
                }
            ],
        )
        for k, command in enumerate(commands)
    ]


def modified(*commands: str) -> list[str]:
    return list(collect(bash(*commands)).modified)


# --- Python code -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "paths"),
    [
        ("open('a.py', 'w').write('x')", ["a.py"]),
        ("open('a.log', 'a')", ["a.log"]),
        ("open('a.bin', 'wb')", ["a.bin"]),
        ("open('new.txt', 'x')", ["new.txt"]),
        ("open('a.py', 'r+')", ["a.py"]),
        ("open('a.py', mode='w')", ["a.py"]),
        ("open(file='a.py', mode='w')", ["a.py"]),
        ("import io\nio.open('a.py', 'w')", ["a.py"]),
        ("import codecs\ncodecs.open('a.py', 'w', 'utf-8')", ["a.py"]),
        (
            "with open('src/a.py') as f:\n    s = f.read()\nwith open('src/a.py', 'w') as f:\n    f.write(s)",
            ["src/a.py"],
        ),
        ("from pathlib import Path\nPath('a.py').write_text('x')", ["a.py"]),
        ("import pathlib\npathlib.Path('a.bin').write_bytes(b'')", ["a.bin"]),
        ("from pathlib import Path\nPath('pkg', 'a.py').write_text('x')", ["pkg/a.py"]),
        ("from pathlib import Path\n(Path('pkg') / 'a.py').write_text('x')", ["pkg/a.py"]),
        ("from pathlib import Path\nPath('a.py').touch()", ["a.py"]),
        ("from pathlib import Path\nwith Path('a.py').open('w') as f: pass", ["a.py"]),
        ("import os\nopen(os.path.join('pkg', 'a.py'), 'w')", ["pkg/a.py"]),
        # A name bound once, to a literal.
        (
            "path = 'src/a.py'\nwith open(path) as f:\n    s = f.read()\nopen(path, 'w').write(s)",
            ["src/a.py"],
        ),
        ("from pathlib import Path\np = Path('a.py')\np.write_text(p.read_text())", ["a.py"]),
        ("import shutil\nshutil.copy('a.py', 'b.py')", ["b.py"]),
        ("import shutil\nshutil.move('a.py', 'b.py')", ["a.py", "b.py"]),
        ("import os\nos.rename('a.py', 'b.py')\nos.remove('c.py')", ["a.py", "b.py", "c.py"]),
        ("open('/testbed/x.py', 'w')", ["/testbed/x.py"]),
        ("open('b.py', 'w'); open('a.py', 'w'); open('b.py', 'w')", ["b.py", "a.py"]),
        # Reading, or paths not written out: nothing.
        ("open('a.py')", []),
        ("open('a.py', 'r')", []),
        ("open('a.py', 'rb')", []),
        ("from pathlib import Path\nPath('a.py').read_text()", []),
        ("open(f'{name}.py', 'w')", []),
        ("open(name, 'w')", []),
        ("open('a.py', mode)", []),
        ("path = 'a.py'\npath = 'b.py'\nopen(path, 'w')", []),  # bound twice
        ("def f(path='a.py'):\n    open(path, 'w')", []),  # a parameter
        ("for path in ['a.py']:\n    open(path, 'w')", []),
        ("import os\nopen(os.path.join(d, 'a.py'), 'w')", []),
        ("open('a.py', 'w'", []),  # does not parse: it would not run either
        ('print(\'open("a.py", "w")\')', []),
        ("x = \"open('a.py', 'w')\"", []),
        ("import shutil\nshutil.copy('a.py', dest)", []),
        ("", []),
    ],
)
def test_python_writes(code: str, paths: list[str]) -> None:
    assert python_writes(code) == paths


@pytest.mark.parametrize(
    ("command", "paths"),
    [
        ("python -c \"open('a.py', 'w').write('x')\"", ["a.py"]),
        ('python3 -c \'from pathlib import Path; Path("a.py").write_text("")\'', ["a.py"]),
        ("python -B -c \"open('a.py', 'w')\"", ["a.py"]),
        ("python -Bc \"open('a.py', 'w')\"", ["a.py"]),
        ("python - <<'EOF'\nwith open('a.py', 'w') as f:\n    f.write('x')\nEOF", ["a.py"]),
        ("python3 <<EOF\nopen('a.py', 'a').write('x')\nEOF", ["a.py"]),
        ("python3.11 - << 'PY'\nopen('a.py', 'w')\nPY", ["a.py"]),
        ("python <<< \"open('a.py', 'w')\"", ["a.py"]),
        ("cd /testbed && python -c \"open('src/a.py', 'w')\"", ["/testbed/src/a.py"]),
        ("bash -c \"python -c \\\"open('a.py', 'w')\\\"\"", ["a.py"]),
        # A script that moves its working directory: relative paths are unknown.
        (
            "python -c \"import os; os.chdir('/x'); open('a.py', 'w'); open('/y/b.py', 'w')\"",
            ["/y/b.py"],
        ),
        # Not Python code we can see.
        ("python -m pytest tests", []),
        ("python x.py", []),  # never written in this history
        ("python -W ignore -c \"open('a.py')\"", []),
        ("echo \"open('a.py', 'w')\"", []),
        ('python -c "$CODE"', []),
    ],
)
def test_python_run_by_a_shell(command: str, paths: list[str]) -> None:
    assert list(shell_ops(command).modified) == sorted(paths)


def test_a_script_written_earlier_modifies_what_it_opens_when_it_is_run() -> None:
    write = "cat > fix.py << 'EOF'\nwith open('src/a.py', 'w') as f:\n    f.write('x')\nEOF"
    assert modified(write) == ["fix.py"]  # written, not run: only the script itself
    assert modified(write, "python fix.py") == ["fix.py", "src/a.py"]
    assert modified(write + "\npython fix.py") == ["fix.py", "src/a.py"]
    run_too = write.replace("<< 'EOF'\n", "<< 'EOF' && python3 fix.py 2>&1 | tail\n", 1)
    assert modified(run_too) == ["fix.py", "src/a.py"]
    # Written under one working directory, run from another spelling of it.
    assert modified(
        "cd /testbed && cat > fix.py << 'EOF'\nopen('a.py', 'w')\nEOF", "python fix.py"
    ) == ["/testbed/fix.py", "a.py"]
    assert modified(
        "cat > /tmp/fix.py << 'EOF'\nopen('a.py', 'w')\nEOF", "cd /r && python /tmp/fix.py"
    ) == ["/r/a.py", "/tmp/fix.py"]
    # Another script of the same name elsewhere is not this one.
    assert modified(
        "cat > a/fix.py << 'EOF'\nopen('x.py', 'w')\nEOF",
        "cat > b/fix.py << 'EOF'\nopen('y.py', 'w')\nEOF",
        "python fix.py",
    ) == ["a/fix.py", "b/fix.py"]
    # Rewritten before it runs: the newer text counts.
    assert modified(
        "cat > fix.py << 'EOF'\nopen('old.py', 'w')\nEOF",
        "cat > fix.py << 'EOF'\nopen('new.py', 'w')\nEOF",
        "python fix.py",
    ) == ["fix.py", "new.py"]
    # Appended to with >>: both parts are the script.
    assert modified(
        "cat > fix.py << 'EOF'\nimport os\nEOF",
        "cat >> fix.py << 'EOF'\nopen('b.py', 'w')\nEOF",
        "python fix.py",
    ) == ["b.py", "fix.py"]


def test_a_script_written_by_a_write_tool_counts_when_run() -> None:
    create = Entry(
        role="assistant",
        parts=[
            {
                "type": "tool_call",
                "id": "w",
                "name": "str_replace_based_edit_tool",
                "arguments": json.dumps(
                    {"command": "create", "path": "/r/fix.py", "file_text": "open('/r/a.py', 'w')"}
                ),
            }
        ],
    )
    write = Entry(
        role="assistant",
        parts=[
            {
                "type": "tool_call",
                "id": "v",
                "name": "write_file",
                "arguments": json.dumps({"path": "/r/go.sh", "content": "touch /r/b.txt"}),
            }
        ],
    )
    ops = collect([create, write, *bash("python /r/fix.py", "bash /r/go.sh")])
    assert ops.modified == ("/r/a.py", "/r/b.txt", "/r/fix.py", "/r/go.sh")


def test_a_shell_script_written_earlier_is_read_when_run() -> None:
    write = "cat > go.sh << 'EOF'\nsed -i 's/a/b/' src/x.py\necho done > out.txt\nEOF"
    assert modified(write, "bash go.sh") == ["go.sh", "out.txt", "src/x.py"]
    assert modified(write, "chmod +x go.sh && ./go.sh") == ["go.sh", "out.txt", "src/x.py"]
    assert modified(write, "sh -x go.sh") == ["go.sh", "out.txt", "src/x.py"]
    assert modified("bash other.sh") == []


# --- Shell ways of writing a file ------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "paths"),
    [
        ("echo hi | tee a.txt", ["a.txt"]),
        ("echo hi | tee -a log.txt", ["log.txt"]),
        ("tee a.py << 'EOF'\nx\nEOF", ["a.py"]),
        ("cat > a.py << 'EOF'\nx\nEOF", ["a.py"]),
        ("cat <<'EOF' > a.py\nx\nEOF", ["a.py"]),
        ("cat << EOF >> a.py\nx\nEOF", ["a.py"]),
        ("echo 'x = 1' >> a.py", ["a.py"]),
        ("printf 'x\\n' > a.py", ["a.py"]),
        ("cp src/a.py src/b.py", ["src/b.py"]),
        ("mv a.py b.py", ["a.py", "b.py"]),
        ("touch a.py", ["a.py"]),
        ("sed -i 's/a/b/' a.py", ["a.py"]),
        ("perl -pi -e 's/a/b/' a.py b.py", ["a.py", "b.py"]),
        ("perl -i -pe 's/a/b/' a.py", ["a.py"]),
        ("perl -i.bak -p -e 's/a/b/' a.py", ["a.py"]),
        ("perl -pi.orig -e 's/a/b/' a.py", ["a.py"]),
        ("git checkout -- a.py b.py", ["a.py", "b.py"]),
        ("git checkout HEAD -- src/a.py", ["src/a.py"]),
        ("git checkout v2.9.0 -- src/a.py", ["src/a.py"]),
        ("git checkout pvlib/pvsystem.py", ["pvlib/pvsystem.py"]),
        ("cd /r && git checkout a.py 2>/dev/null || true", ["/r/a.py"]),
        ("git restore a.py", ["a.py"]),
        ("git restore --source=HEAD~1 a.py", ["a.py"]),
        ("git restore --staged --worktree a.py", ["a.py"]),
        ("git -C sub checkout -- a.py", ["sub/a.py"]),
        ("git mv a.py b.py", ["a.py", "b.py"]),
        ("git rm old.py", ["old.py"]),
        ("git apply <<'EOF'\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\nEOF", ["x.py"]),
        ("patch -p1 <<'EOF'\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\nEOF", ["x.py"]),
        ("patch src/a.py < fix.diff", ["src/a.py"]),
        ("patch -p0 src/a.py fix.diff", ["src/a.py"]),
        # Near misses: nothing is written, or we cannot tell what.
        ("git checkout main", []),
        ("git checkout v2.9.0", []),
        ("git checkout -b feature/x.y", []),
        ("git checkout .", []),
        ("git restore --staged a.py", []),
        ("git rm -r --cached build", []),
        ("git apply --check fix.patch", []),
        ("git apply --stat <<'EOF'\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\nEOF", []),
        ("patch --dry-run -p1 < fix.patch", []),
        ("patch -p1 < unknown.patch", []),
        ("git apply unknown.patch", []),
        ("perl -pe 's/a/b/' a.py", []),
        ("perl -e 'print 1'", []),
        ("tee $OUT", []),
        ("git stash", []),
        ("git diff a.py", []),
    ],
)
def test_shell_writes(command: str, paths: list[str]) -> None:
    assert list(shell_ops(command).modified) == sorted(paths)


def test_a_patch_file_written_earlier_modifies_what_it_names() -> None:
    patch = "--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-a\n+b\n"
    write = f"cat > fix.patch << 'EOF'\n{patch}EOF"
    assert modified(write) == ["fix.patch"]
    assert modified(write, "git apply fix.patch 2>&1") == ["fix.patch", "src/a.py"]
    assert modified(write, "git apply -v --whitespace=fix fix.patch") == ["fix.patch", "src/a.py"]
    assert modified(write, "patch -p1 < fix.patch") == ["fix.patch", "src/a.py"]
    assert modified(write, "patch -p1 -i fix.patch") == ["fix.patch", "src/a.py"]
    assert modified(write, "patch -p1 --input=fix.patch") == ["fix.patch", "src/a.py"]
    # Written where the agent stood (unknown), applied after a cd: the same file, taken
    # to be in /r (the one remembered file whose path ends like it).
    assert modified(write, "cd /r && git apply fix.patch") == ["/r/src/a.py", "fix.patch"]
    assert modified(write, "git apply --check fix.patch") == ["fix.patch"]
    assert modified(write, "cat fix.patch | git apply") == ["fix.patch"]  # piped: not followed


def test_file_writes_accumulate_across_compactions() -> None:
    first = collect(bash("python -c \"open('a.py', 'w')\""))
    details = first.to_details()
    second = collect(bash("git checkout -- b.py"), FileOps.from_details(details))
    assert second.modified == ("a.py", "b.py")


# --- Properties ------------------------------------------------------------------------

PYTHON_PIECES = st.sampled_from(
    [
        "open(",
        "'a.py'",
        '"b.py"',
        ", ",
        "'w'",
        "'r'",
        "mode='a'",
        ")",
        "\n",
        "p = ",
        "p",
        "Path(",
        ").write_text(",
        "f'{x}.py'",
        " / ",
        "import os\n",
        "os.path.join(",
        "shutil.copy(",
        "def f(p):\n    ",
        "with ",
        " as f:\n    f.write(1)\n",
    ]
)


@PROPERTY
@given(st.lists(PYTHON_PIECES, max_size=25).map("".join) | st.text(max_size=60))
def test_python_writes_only_names_literal_paths(code: str) -> None:
    paths = python_writes(code)
    assert len(paths) == len(set(paths))
    for path in paths:
        # Every part of the path is spelled out in the code.
        assert all(part in code for part in path.split("/") if part)
        assert "{" not in path


# --- The real traces -------------------------------------------------------------------

HEREDOC = re.compile(r"cat\s*>\s*([\w./-]+)\s*<<\s*'?(\w+)'?\n(.*?)\n\2(?:\n|$)", re.S)
OPEN_WRITE = re.compile(r"""open\(\s*(['"])([\w./-]+)\1\s*,\s*(['"])[wax]b?\+?\3""")
RUN = re.compile(r"\bpython3?\s+([\w./-]+\.py)\b")


def trace_entries(path: Path) -> list[Entry]:
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(load(path))]


def command_of(part: dict[str, Any]) -> str:
    value = json.loads(part["arguments"]).get("command", "")
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_every_file_a_heredoc_or_a_script_writes_is_modified(path: Path) -> None:
    """By rules of their own (a few regular expressions): every file a ``cat >
    f << EOF`` writes, and every literal path a script written so opens for writing
    once ``python f`` runs it, is among the modified files (by name: the commands
    move between working directories)."""
    entries = trace_entries(path)
    ops = collect(entries)
    names = {posixpath.basename(p) for p in ops.modified}
    scripts: dict[str, str] = {}
    expected: set[str] = set()
    for entry in entries:
        for part in entry.tool_calls():
            command = command_of(part)
            for m in HEREDOC.finditer(command):
                scripts[posixpath.basename(m[1])] = m[3]
                expected.add(posixpath.basename(m[1]))
            for m in RUN.finditer(command):
                body = scripts.get(posixpath.basename(m[1]), "")
                expected |= {posixpath.basename(w[2]) for w in OPEN_WRITE.finditer(body)}
    assert expected, "every session writes a script"
    assert expected <= names, sorted(expected - names)


def test_traces_scripts_find_the_source_files_they_edit() -> None:
    """The traces' agents edit source files mostly through Python scripts: those
    files are now listed (they were not before)."""
    found = {}
    for path in trace_files():
        ops = collect(trace_entries(path))
        found[path.name.split(".")[0]] = set(ops.modified)
    assert "src/marshmallow/fields.py" in found["marshmallow-code__marshmallow-1359"]
    assert "pvlib/tools.py" in found["pvlib__pvlib-python-1606"]
    assert "pydicom/filewriter.py" in found["pydicom__pydicom-1413"]
    assert "/testbed/astroid/raw_building.py" in found["pylint-dev__astroid-1978"]
    assert "/testbed/astroid/modutils.py" in found["pylint-dev__astroid-1333"]  # git checkout
    assert "src/sqlfluff/rules/L003.py" in found["sqlfluff__sqlfluff-1733"]  # patch -p1 <


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_collecting_in_pieces_loses_only_scripts_run_after_a_cut(path: Path) -> None:
    """Cumulative across compactions: collected in four pieces (the previous lists
    passed on), the lists hold all that one collect finds, but for a script written
    before a cut and run after it (its text is not carried)."""
    entries = trace_entries(path)
    whole = collect(entries)
    cuts = [len(entries) * k // 4 for k in range(5)]
    ops: FileOps | None = None
    for start, end in itertools.pairwise(cuts):
        ops = collect(entries[start:end], ops)
    assert ops is not None
    assert set(ops.modified) <= set(whole.modified)
    missing = set(whole.modified) - set(ops.modified)
    assert len(missing) <= 2, missing
