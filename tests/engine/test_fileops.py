"""File operations: which files the agent read and modified, from its tool calls."""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.compaction.fileops import FileOps, collect, patch_paths, shell_ops
from app.engine.formats.openai_format import parse_message
from app.engine.model import Entry
from tests.traces import load, trace_files

PROPERTY = settings(max_examples=300, deadline=None)


def call(name: str, arguments: Any, call_id: str = "c1") -> Entry:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Entry(
        role="assistant",
        parts=[{"type": "tool_call", "id": call_id, "name": name, "arguments": raw}],
    )


def ops_of(name: str, arguments: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    ops = collect([call(name, arguments)])
    return ops.read, ops.modified


# --- FileOps ------------------------------------------------------------------------------


def test_file_ops_are_sorted_unique_and_modified_wins() -> None:
    ops = FileOps.of(read=["b.py", "a.py", "b.py", "c.py"], modified=["c.py", "z.py", "c.py"])
    assert ops == FileOps(read=("a.py", "b.py"), modified=("c.py", "z.py"))
    assert FileOps(read=("x", "x"), modified=("x",)) == FileOps((), ("x",))


def test_merge_is_cumulative() -> None:
    before = FileOps.of(read=["a.py", "b.py"], modified=["m.py"])
    now = FileOps.of(read=["c.py", "m.py"], modified=["b.py"])
    assert before.merge(now) == FileOps(read=("a.py", "c.py"), modified=("b.py", "m.py"))
    assert before.merge(FileOps()) == before


def test_details_round_trip_and_junk_is_ignored() -> None:
    ops = FileOps.of(read=["a.py"], modified=["b.py"])
    assert ops.to_details() == {"read_files": ["a.py"], "modified_files": ["b.py"]}
    assert FileOps.from_details(ops.to_details()) == ops
    assert FileOps.from_details(None) == FileOps()
    assert FileOps.from_details({}) == FileOps()
    junk = {"read_files": ["a.py", 3, None, ""], "modified_files": "b.py", "other": [1]}
    assert FileOps.from_details(junk) == FileOps(read=("a.py",))


def test_collect_adds_to_the_previous_compaction() -> None:
    previous = FileOps.from_details({"read_files": ["old.py", "x.py"], "modified_files": ["m.py"]})
    entries = [call("read", {"path": "new.py"}), call("edit", {"path": "x.py"}, "c2")]
    assert collect(entries, previous) == FileOps(
        read=("new.py", "old.py"), modified=("m.py", "x.py")
    )
    assert collect([], previous) == previous


def test_only_assistant_tool_calls_count() -> None:
    text = Entry(role="user", parts=[{"type": "text", "text": "cat /etc/passwd"}])
    result = Entry(role="tool", parts=[{"type": "text", "text": "cat a.py"}], tool_call_id="c1")
    user_call = Entry(
        role="user",
        parts=[{"type": "tool_call", "id": "c", "name": "read", "arguments": '{"path": "u.py"}'}],
    )
    assert collect([text, result, user_call]) == FileOps()


# --- Structured tools ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "read", "modified"),
    [
        ("read", {"path": "/src/a.py"}, ("/src/a.py",), ()),
        ("Read", {"file_path": "/src/a.py", "offset": 10}, ("/src/a.py",), ()),
        ("read_file", {"target_file": "./src/../src/a.py"}, ("src/a.py",), ()),
        ("view_file", {"absolute_path": "/a b/c.txt"}, ("/a b/c.txt",), ()),
        ("open_file", {"filePath": "a.py"}, ("a.py",), ()),
        ("readfile", {"filename": "a.py"}, ("a.py",), ()),
        ("cat", {"file": "a.py"}, ("a.py",), ()),
        ("read_many_files", {"paths": ["a.py", "src/*.py", 3, "b.py"]}, ("a.py", "b.py"), ()),
        ("Write", {"file_path": "/w.py", "content": "x"}, (), ("/w.py",)),
        ("write_file", {"path": "w.py"}, (), ("w.py",)),
        ("create_file", {"path": "w.py"}, (), ("w.py",)),
        ("Edit", {"file_path": "e.py", "old_string": "a", "new_string": "b"}, (), ("e.py",)),
        ("MultiEdit", {"file_path": "e.py", "edits": []}, (), ("e.py",)),
        ("replace_in_file", {"path": "e.py"}, (), ("e.py",)),
        ("mcp__filesystem__edit_file", {"path": "e.py"}, (), ("e.py",)),
        ("str_replace_based_edit_tool", {"command": "view", "path": "/t/a.py"}, ("/t/a.py",), ()),
        ("str_replace_editor", {"command": "create", "path": "/t/n.py"}, (), ("/t/n.py",)),
        ("str_replace_editor", {"command": "str_replace", "path": "a.py"}, (), ("a.py",)),
        ("str_replace_editor", {"command": "insert", "path": "a.py"}, (), ("a.py",)),
        ("str_replace_editor", {"command": "undo_edit", "path": "a.py"}, (), ("a.py",)),
        ("str_replace_editor", {"command": "frobnicate", "path": "a.py"}, (), ()),
        ("str_replace_editor", {"path": "a.py"}, (), ("a.py",)),
        # Not one file, or not a file tool at all.
        ("read", {"path": "src/"}, (), ()),
        ("read", {"path": ""}, (), ()),
        ("read", {"path": 42}, (), ()),
        ("read", {"pattern": "a.py"}, (), ()),
        ("grep", {"path": "src", "pattern": "x"}, (), ()),
        ("search", {"path": "a.py"}, (), ()),
        ("web_fetch", {"url": "https://example.com/a.py"}, (), ()),
    ],
)
def test_structured_tools(
    name: str, arguments: dict[str, Any], read: tuple[str, ...], modified: tuple[str, ...]
) -> None:
    assert ops_of(name, arguments) == (read, modified)


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"a.py"', "null", ""])
def test_bad_arguments_are_ignored(arguments: str) -> None:
    assert ops_of("read", arguments) == ((), ())
    assert ops_of("bash", arguments) == ((), ())


CODEX_PATCH = """*** Begin Patch
*** Update File: src/app.py
@@ def main():
-    print("hi")
+    print("hello")
*** Add File: docs/new.md
+# New
*** Delete File: old/gone.py
*** Update File: src/move_me.py
*** Move to: src/moved.py
@@
-x
+y
*** End Patch"""

UNIFIED_DIFF = """diff --git a/src/a.py b/src/a.py
--- a/src/a.py\t2024-01-01 00:00:00
+++ b/src/a.py\t2024-01-01 00:00:01
@@ -1,2 +1,2 @@
--- not a header: a removed SQL comment
+++ nor this: an added line
 context
--- a/src/deleted.py
+++ /dev/null
@@ -1 +0,0 @@
-gone
--- /dev/null
+++ b/src/added.py
@@ -0,0 +1 @@
+new
"""


def test_patch_paths() -> None:
    assert patch_paths(CODEX_PATCH) == [
        "src/app.py",
        "docs/new.md",
        "old/gone.py",
        "src/move_me.py",
        "src/moved.py",
    ]
    assert patch_paths(UNIFIED_DIFF) == ["src/a.py", "src/deleted.py", "src/added.py"]
    assert patch_paths("no patch here\n+++ b/x.py") == []


def test_patch_tools() -> None:
    assert ops_of("apply_patch", {"input": CODEX_PATCH})[1] == (
        "docs/new.md",
        "old/gone.py",
        "src/app.py",
        "src/move_me.py",
        "src/moved.py",
    )
    assert ops_of("patch", {"patch": UNIFIED_DIFF}) == (
        (),
        ("src/a.py", "src/added.py", "src/deleted.py"),
    )
    assert ops_of("apply_patch", {"input": "garbage"}) == ((), ())


# --- Shell commands -----------------------------------------------------------------------

R, M = "read", "modified"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # Reading.
        ("cat -n /testbed/x.py", {R: ["/testbed/x.py"]}),
        ("cat a.py b/c.py", {R: ["a.py", "b/c.py"]}),
        ("head -50 ./src/a.py", {R: ["src/a.py"]}),
        ("head -n 20 a.py", {R: ["a.py"]}),
        ("tail -n +962 a.py | head", {R: ["a.py"]}),
        ("less +F log.txt", {R: ["log.txt"]}),
        ("nl -ba a.py | sed -n '1,5p'", {R: ["a.py"]}),
        ("wc -l a.py b.py", {R: ["a.py", "b.py"]}),
        ("sed -n '70,95p' ./pvlib/iam.py", {R: ["pvlib/iam.py"]}),
        ("sed -n -e '1p' -e '$p' a.py", {R: ["a.py"]}),
        ("awk 'NR>=10 && NR<=20' a.py", {R: ["a.py"]}),
        ("cat -n ./pyvista/core/grid.py | sed -n '126,160p'", {R: ["pyvista/core/grid.py"]}),
        ("python x.py < input.txt", {R: ["input.txt"]}),
        # grep: a clear file operand only.
        ('grep -n "def x" ./src/a.py -A 20', {R: ["src/a.py"]}),
        ('grep ">" page.html', {R: ["page.html"]}),
        ("grep -e foo -e bar a.py b.py", {R: ["a.py", "b.py"]}),
        ("grep foo Makefile", {}),
        ('grep -r "x" src/ --include="*.py"', {}),
        ("grep -rn x src/a.py", {}),
        ("grep -n x src/*.py", {}),
        ("ps aux | grep python", {}),
        ("find . -name '*.py' -exec grep -l x {} \\; | grep -v test_pr.py", {}),
        # Modifying.
        ("sed -i 's/a/b/' /testbed/x.py", {M: ["/testbed/x.py"]}),
        ("sed -i.bak -e 's/a/b/' a.py", {M: ["a.py"]}),
        ("sed -i '' 's/a/b/' a.py", {M: ["a.py"]}),
        ("sed --in-place 's/a/b/' a.py", {M: ["a.py"]}),
        (
            "cat <<'EOF' > /testbed/reproduce.py\nimport os\nprint(1) > x\nEOF",
            {M: ["/testbed/reproduce.py"]},
        ),
        ("cat > a.py << EOF\n$x\nEOF\ncat b.py", {M: ["a.py"], R: ["b.py"]}),
        ("cat <<-EOF >> log.txt\n\tline\n\tEOF", {M: ["log.txt"]}),
        ("echo hi > out.txt", {M: ["out.txt"]}),
        ("echo hi >> out.txt 2>&1", {M: ["out.txt"]}),
        ("python x.py &> all.log", {M: ["all.log"]}),
        ("python x.py > /dev/null 2>&1", {}),
        ("echo hi | tee a.txt b.txt", {M: ["a.txt", "b.txt"]}),
        ("echo hi | tee -a log.txt > /dev/null", {M: ["log.txt"]}),
        ("touch new.py", {M: ["new.py"]}),
        ("rm -f old.py build.log", {M: ["build.log", "old.py"]}),
        ("rm -rf build", {}),
        ("mv a.py b.py", {M: ["a.py", "b.py"]}),
        ("mv a.py b.py dest/", {M: ["a.py", "b.py"]}),
        ("mv -t dest a.py", {M: ["a.py"]}),
        ("cp src/a.py src/a.py.backup", {M: ["src/a.py.backup"]}),
        ("cp a.py /tmp", {}),
        ("cp -r src dest", {}),
        ("git diff -- a.py b.py > patch.txt && cat patch.txt", {M: ["patch.txt"]}),
        ("git checkout -- a.py", {M: ["a.py"]}),
        # Python code that opens a file for writing (see test_fileops_scripts.py).
        ("python -c \"open('a.py', 'w').write('cat > b.py')\"", {M: ["a.py"]}),
        ("python3 - <<'EOF'\nopen('a.py','w')\nEOF", {M: ["a.py"]}),
        ("git apply <<'EOF'\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\nEOF", {M: ["x.py"]}),
        ("patch -p1 <<'EOF'\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\nEOF", {M: ["x.py"]}),
        (
            f"apply_patch <<'EOF'\n{CODEX_PATCH}\nEOF",
            {M: ["docs/new.md", "old/gone.py", "src/app.py", "src/move_me.py", "src/moved.py"]},
        ),
        # Working directories.
        ("cd /testbed && cat > t.py << 'EOF'\nx\nEOF", {M: ["/testbed/t.py"]}),
        ("cd /testbed && sed -n '1,5p' src/a.py", {R: ["/testbed/src/a.py"]}),
        ("cd sub && cat ../a.py", {R: ["a.py"]}),
        ("cd /a && cd b && cat c.py", {R: ["/a/b/c.py"]}),
        ("(cd sub && cat a.py); cat b.py", {R: ["b.py", "sub/a.py"]}),
        ("cd $HOME && cat a.py /abs/b.py", {R: ["/abs/b.py"]}),
        ("cd && cat a.py", {}),
        ("cd ~/x && cat a.py", {}),
        # Wrappers, operators, nesting.
        ("FOO=1 sudo cat a.py", {R: ["a.py"]}),
        ("if true; then cat a.py; fi", {R: ["a.py"]}),
        ("cat a.py && cat b.py || cat c.py; cat d.py | wc", {R: ["a.py", "b.py", "c.py", "d.py"]}),
        ("cat a.py\ncat b.py", {R: ["a.py", "b.py"]}),
        ("cat a.py \\\n  b.py", {R: ["a.py", "b.py"]}),
        ("bash -c 'cat a.txt > b.txt'", {R: ["a.txt"], M: ["b.txt"]}),
        ('bash -lc "cd /r && touch x.py"', {M: ["/r/x.py"]}),
        ("cat a.py # > not_a_file.py", {R: ["a.py"]}),
        # Ignored: programs we do not model, and anything unplain.
        ('python -c "\nimport x\ncat = 1\n"', {}),
        ("ls -la src/", {}),
        ("find . -name a.py", {}),
        ("pip install -e .", {}),
        ("cat $FILE", {}),
        ("cat src/*.py", {}),
        ("cat ~/notes.txt", {}),
        ("cat `which python`", {}),
        ("echo x > out_$1.txt", {}),
        ("echo 'unclosed > a.py", {}),
        ('echo "unclosed > a.py', {}),
        ("cat -", {}),
        ("cat 'my file.py'", {}),
        ("echo '>' a.py", {}),
        ("cat /dev/stdin > /dev/stderr", {}),
        ("", {}),
    ],
)
def test_shell_commands(command: str, expected: dict[str, list[str]]) -> None:
    ops = shell_ops(command)
    assert {R: list(ops.read), M: list(ops.modified)} == {
        R: expected.get(R, []),
        M: expected.get(M, []),
    }
    assert ops_of("bash", {"command": command}) == (ops.read, ops.modified)


@pytest.mark.parametrize(
    ("name", "arguments", "read", "modified"),
    [
        ("shell", {"command": ["bash", "-lc", "cat a.py"]}, ("a.py",), ()),
        ("shell", {"command": ["cat", "a b.py"]}, (), ()),
        ("shell", {"command": ["cat", "a.py"]}, ("a.py",), ()),
        (
            "shell",
            {"command": ["apply_patch", CODEX_PATCH]},
            (),
            ("docs/new.md", "old/gone.py", "src/app.py", "src/move_me.py", "src/moved.py"),
        ),
        ("run_terminal_cmd", {"command": "cat a.py"}, ("a.py",), ()),
        ("execute_command", {"cmd": "touch a.py"}, (), ("a.py",)),
        ("Bash", {"command": "cat a.py", "description": "look"}, ("a.py",), ()),
        ("exec", {"script": "cat a.py"}, ("a.py",), ()),
        ("execute_bash", {"command": "cat a.py"}, ("a.py",), ()),
        ("bash", {"command": 42}, (), ()),
        ("bash", {"command": ["cat", 1]}, (), ()),
        ("python", {"command": "cat a.py"}, (), ()),
    ],
)
def test_shell_tools(
    name: str, arguments: dict[str, Any], read: tuple[str, ...], modified: tuple[str, ...]
) -> None:
    assert ops_of(name, arguments) == (read, modified)


UNSAFE = set("$()`*?[]{}<>|;&'\"\\")


def plain(path: str) -> bool:
    return (
        bool(path)
        and not path.startswith(("-", "~"))
        and not any(c in UNSAFE or c.isspace() for c in path)
        and posixpath.normpath(path) == path
        and path not in (".", "..", "/")
    )


SHELL_WORDS = ["cat ", "sed -i ", "EOF", "<<", "cd ", "grep ", "mv ", "cp ", "x.py", "tee "]
PATCH_LINES = ["+++ b/", "--- a/", "@@ -1 +1 @@", "*** Update File: "]
SHELLISH = st.lists(
    st.sampled_from([*"abc./-_ \n\t'\"\\$*;&|<>()#=~", *SHELL_WORDS, *PATCH_LINES]), max_size=30
).map("".join)


@PROPERTY
@given(SHELLISH | st.text(max_size=40))
def test_any_command_line_gives_only_plain_paths(command: str) -> None:
    ops = shell_ops(command)
    assert all(plain(p) for p in ops.read + ops.modified), ops
    assert not set(ops.read) & set(ops.modified)


@PROPERTY
@given(st.text(max_size=30), st.text(max_size=60))
def test_any_tool_call_is_survived(name: str, arguments: str) -> None:
    collect([call(name, arguments)])


# --- The real traces ----------------------------------------------------------------------


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.name.split(".")[0])
def test_traces_give_sensible_files(path: Any) -> None:
    messages = load(path)
    entries = [parse_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    ops = collect(entries)
    assert ops.modified, "every session writes something (at least its patch.txt)"
    assert ops.read or len(ops.modified) > 5
    assert all(plain(p) for p in ops.read + ops.modified)
    # No invented names: every file's name is written somewhere in a tool call.
    said = " ".join(p["arguments"] for e in entries for p in e.tool_calls())
    assert all(posixpath.basename(p) in said for p in ops.read + ops.modified)
    # Cumulative: collecting in two halves gives the same lists.
    half = len(entries) // 2
    assert collect(entries[half:], collect(entries[:half])) == ops


def test_a_trace_in_detail() -> None:
    (path,) = [p for p in trace_files() if "pvlib__pvlib-python-1154" in p.name]
    entries = [parse_message(m, f"messages[{i}]") for i, m in enumerate(load(path))]
    ops = collect(entries)
    # Read with grep and sed -n, then changed with sed -i and cp: modified only.
    assert "pvlib/irradiance.py" in ops.modified
    assert "pvlib/irradiance.py.backup" in ops.modified  # cp ./pvlib/irradiance.py{,.backup}
    assert "reproduce_issue.py" in ops.modified  # cat > reproduce_issue.py << 'EOF'
    assert "patch.txt" in ops.modified  # git diff ... > patch.txt
    assert ops.read == ()
