"""The scorecard's fact rules (bench/eval_facts.py): each kind found in lines as the traces
have them, and what looks like one but is not left out."""

from __future__ import annotations

import json
from typing import Any

from bench import eval_facts as ef


def tool(content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c1", "content": content}


def call(command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        ],
    }


def kinds(message: dict[str, Any], kind: str) -> list[ef.Fact]:
    return [f for f in ef.facts_of_message(message, 0) if f.kind == kind]


def test_identifiers_are_snake_case_or_camel_case_words() -> None:
    text = (
        "def validate_value(self, value):\n    self._invoke_field_validators(WIDGET_SEED)\n"
        "    return getTotalIrradiance(x) + DataFrame(y) + PVSystem()\n"
    )
    assert ef.identifiers(text) == [
        "validate_value",
        "_invoke_field_validators",
        "WIDGET_SEED",
        "getTotalIrradiance",
        "DataFrame",
    ]


def test_file_stems_paths_options_and_dunders_are_not_identifiers() -> None:
    text = (
        "python test_fields.py; ls /opt/site_packages/x; pytest --tb_short -x_y;"
        " __init__ __main__ $HOME_DIR a_b abc12345_678 plain words here"
    )
    assert ef.identifiers(text) == []


def test_an_identifier_is_shown_as_a_whole_word_only() -> None:
    fact = ef.Fact("identifier", "make_bar", ("make_bar",), "make_bar", 0)
    assert ef.shown(fact, "then make_bar() runs")
    assert not ef.shown(fact, "then make_bar_baz() runs")
    assert not ef.shown(fact, "then remake_bar() runs")


def test_locations_in_pytest_grep_and_traceback_forms() -> None:
    output = (
        "src/marshmallow/schema.py:628: in validate\n"
        "tests/test_schema.py:17: AssertionError\n"
        'Traceback (most recent call last):\n  File "/testbed/astroid/registry.py", line 135,'
        " in load\n"
        '  File "<frozen importlib._bootstrap>", line 241, in _call_with_frames_removed\n'
    )
    found = kinds(tool(output), "location")
    assert [f.text for f in found] == [
        "src/marshmallow/schema.py:628",
        "tests/test_schema.py:17",
        'File "/testbed/astroid/registry.py", line 135',
    ]
    assert found[0].query == "src/marshmallow/schema.py:628"
    assert found[2].query == "registry.py line 135"
    # Either form shows either fact: a summary may write the frame as path:line.
    assert ef.shown(found[2], "the error is at astroid/registry.py:135 in load")
    assert ef.shown(found[0], 'File "/testbed/src/marshmallow/schema.py", line 628, in x')


def test_times_urls_and_versions_are_not_locations() -> None:
    output = "took 12:30:01 at http://example.com:8080/x and numpy.py:1.5 and 10:45\n"
    assert kinds(tool(output), "location") == []


def test_numbers_are_test_counts_and_versions() -> None:
    output = (
        "platform linux -- Python 3.11.5, pytest-8.3.3, pluggy-1.5.0\n"
        "========== 2 failed, 5 passed, 1 warning in 0.34s ==========\n"
        "Ran 12 tests in 0.004s\n"
        "Successfully installed numpy==1.26 marshmallow-2.20.0\n"
    )
    assert [f.text for f in kinds(tool(output), "number")] == [
        "Python 3.11.5",
        "pytest-8.3.3",
        "pluggy-1.5.0",
        "2 failed, 5 passed, 1 warning",
        "Ran 12 tests",
        "numpy==1.26",
        "marshmallow-2.20.0",
    ]


def test_a_version_is_shown_in_any_case() -> None:
    (fact,) = kinds(tool("Successfully installed MarkupSafe-3.0.3\n"), "number")
    assert ef.shown(fact, "Downloading markupsafe-3.0.3-cp311-cp311-manylinux2014_x86_64.whl")
    assert not ef.shown(fact, "Downloading markupsafe-3.0.2-cp311.whl")


def test_counts_without_a_closing_time_and_bare_numbers_are_not_numbers() -> None:
    output = "I see 3 failed attempts and 5 passed checks.\nvalue 1.5 at 0.34s, 127.0.0 and 2.5\n"
    assert kinds(tool(output), "number") == []
    # An assistant's or a user's text has no tool output's numbers.
    said = {"role": "assistant", "content": "========== 2 failed in 0.3s =========="}
    assert kinds(said, "number") == []


def test_error_lines_with_a_query_of_distinctive_words() -> None:
    output = (
        "Traceback (most recent call last):\n"
        '  File "/testbed/analyze_fix.py", line 3, in <module>\n'
        "NameError: name 'compute_total' is not defined\n"
        "FAILED tests/test_fields.py::test_nested_validation - TypeError: boom\n"
        "<returncode>1</returncode>\n"
    )
    found = kinds(tool(output), "error")
    assert [f.text for f in found] == [
        "NameError: name 'compute_total' is not defined",
        "FAILED tests/test_fields.py::test_nested_validation - TypeError: boom",
    ]
    assert found[0].query == "NameError compute_total defined"
    assert found[0].needles == ("NameError: name 'compute_total' is not defined",)
    assert 1 < len(found[1].query.split()) <= 3


def test_an_output_without_an_error_has_no_error_line() -> None:
    output = "<returncode>0</returncode>\n<output>\nall good: 14 files checked\n</output>"
    assert kinds(tool(output), "error") == []


def test_commands_are_the_first_line_of_a_shell_call() -> None:
    found = kinds(
        call("cd /testbed && grep -n '_invoke_validators' src/marshmallow/schema.py"), "command"
    )
    assert [f.text for f in found] == [
        "cd /testbed && grep -n '_invoke_validators' src/marshmallow/schema.py"
    ]
    assert found[0].query == "_invoke_validators schema.py"
    heredoc = kinds(call("cat > test_greedy.py << 'EOF'\nprint(1)\nEOF"), "command")
    assert [f.text for f in heredoc] == ["cat > test_greedy.py << 'EOF'"]
    assert heredoc[0].query == "cat test_greedy.py"
    # One distinctive word: the program it runs joins it.
    ranged = kinds(call("cd /testbed && sed -n '480,510p' src/marshmallow/fields.py"), "command")
    assert ranged[0].query == "sed fields.py"


def test_short_commands_and_edits_are_not_commands() -> None:
    assert kinds(call("ls -la"), "command") == []
    edit = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {
                    "name": "str_replace_editor",
                    "arguments": json.dumps({"command": "view", "path": "/testbed/src/x.py"}),
                },
            }
        ],
    }
    # An editor's "command" argument is its action ("view"), too short to be a command.
    assert kinds(edit, "command") == []


def test_the_system_prompt_has_no_facts() -> None:
    system = {"role": "system", "content": "Use snake_case names. Ran 3 tests in 0.1s"}
    assert ef.facts_of_message(system, 0) == []


def test_facts_compacted_away_leave_out_what_the_kept_messages_show() -> None:
    messages = [
        {"role": "user", "content": "Fix parse_date_value in dates.py."},
        call("python -m pytest tests/test_dates.py -x -q"),
        tool("FAILED tests/test_dates.py::test_leap - ValueError: day is out of range"),
        call("grep -n parse_date_value src/dates.py"),
    ]
    facts = ef.trace_facts(messages)
    kept = ef.compacted_away(facts, 3, "grep -n parse_date_value src/dates.py")
    texts = {(f.kind, f.text) for f in kept}
    assert ("identifier", "parse_date_value") not in texts  # still in a kept message
    assert ("command", "python -m pytest tests/test_dates.py -x -q") in texts
    assert ("identifier", "test_leap") in texts
    assert all(f.index < 3 for f in kept)


def test_sampling_is_seeded_and_capped_per_kind() -> None:
    facts = [ef.Fact("identifier", f"name_{i}", (f"name_{i}",), f"name_{i}", i) for i in range(20)]
    facts += [
        ef.Fact("command", f"run thing {i}", (f"run thing {i}",), "thing", i) for i in range(2)
    ]
    picked = ef.sample(facts, 3, "seed:1")
    assert [f.kind for f in picked].count("identifier") == 3
    assert [f.kind for f in picked].count("command") == 2
    assert picked == ef.sample(list(reversed(facts)), 3, "seed:1")
    # Another salt (another compaction), other facts.
    assert {f.text for f in picked} != {f.text for f in ef.sample(facts, 3, "seed:2")}


def test_a_snippet_is_read_without_its_match_marks() -> None:
    assert ef.snippet_text("x = «make_bar»(1)\n  y") == "x = make_bar(1) y"
