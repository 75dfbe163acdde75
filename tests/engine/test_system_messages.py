"""Anthropic's mid-conversation system messages: a ``role: "system"`` message inside
``messages`` is stored as a system entry and, where the request allows one, shown to the
model as such, in its place (not merged into a user turn); elsewhere as ``<system>``
user text, as before."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats import anthropic_format
from app.engine.model import Entry, Role
from app.engine.proxy.history import digest
from app.engine.window.context import (
    check_anthropic_pairing,
    check_anthropic_roles,
    pair_tool_calls,
)
from app.engine.window.view import assemble_anthropic
from tests.engine.strategies import call_part, messy_histories, text_part, tool_entry
from tests.engine.test_view import stored

# What Claude Code sends (2.1.332): the harness's context as a system message after the
# user's turn, its per-turn effort in a key of the message's own.
KEYS = {"output_config": {"effort": "medium"}}


def _system(text: str, **keys: Any) -> Entry:
    return Entry(role="system", parts=[text_part(text)], extra=dict(keys))


def _claude_code_turns() -> list[Entry]:
    return [
        Entry(role="user", parts=[text_part("list the files")]),
        _system("# Environment\ncwd: /work", **KEYS),
        Entry(role="assistant", parts=[text_part("looking"), call_part("t1")]),
        tool_entry("t1"),
        _system("Deferred tools: Cron", **KEYS),
        Entry(role="assistant", parts=[text_part("done")]),
        Entry(role="user", parts=[text_part("thanks")]),
    ]


def test_system_messages_stay_in_place_with_their_keys() -> None:
    entries = _claude_code_turns()
    system_json, messages_json, used = assemble_anthropic(stored(entries), system_messages=True)
    messages = orjson.loads(messages_json)
    assert orjson.loads(system_json) == []
    assert [m["role"] for m in messages] == [
        "user",
        "system",
        "assistant",
        "user",
        "system",
        "assistant",
        "user",
    ]
    assert messages[1] == {
        "role": "system",
        "content": [{"type": "text", "text": "# Environment\ncwd: /work"}],
        "output_config": {"effort": "medium"},
    }
    assert [b["type"] for b in messages[3]["content"]] == ["tool_result"]
    assert "<system>" not in messages_json.decode()
    assert used == list(range(len(entries)))
    _, rendered = anthropic_format.render_messages(pair_tool_calls(entries), system_messages=True)
    assert rendered == messages
    assert check_anthropic_pairing(messages, allow_pending=False, system_messages=True) == []


def test_without_leave_a_system_entry_is_user_text_as_before() -> None:
    entries = _claude_code_turns()
    _, messages_json, _ = assemble_anthropic(stored(entries))
    messages = orjson.loads(messages_json)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"][1] == {
        "type": "text",
        "text": "<system>\n# Environment\ncwd: /work\n</system>",
    }
    assert "output_config" not in messages_json.decode()  # a user turn has no such key
    assert check_anthropic_pairing(messages, allow_pending=False) == []


def test_a_leading_system_entry_is_the_top_level_system_either_way() -> None:
    """The API takes no system message first: a system entry before any message (one
    a compaction kept, say) goes to the top-level ``system``, as it always did."""
    entries = [_system("rules", **KEYS), *_claude_code_turns()]
    for allowed in (False, True):
        system_json, messages_json, _ = assemble_anthropic(stored(entries), system_messages=allowed)
        assert orjson.loads(system_json) == [{"type": "text", "text": "rules"}]
        assert orjson.loads(messages_json)[0]["role"] == "user"


def test_an_empty_system_entry_sends_nothing() -> None:
    entries = [
        Entry(role="user", parts=[text_part("go")]),
        _system(""),
        Entry(role="assistant", parts=[text_part("ok")]),
    ]
    _, messages_json, used = assemble_anthropic(stored(entries), system_messages=True)
    assert [m["role"] for m in orjson.loads(messages_json)] == ["user", "assistant"]
    assert used == [0, 1, 2]


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    """Messy histories with system entries (some with keys of their own) anywhere."""
    entries = draw(messy_histories())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(entries)))
        role: Role = draw(st.sampled_from(["system", "developer"]))
        keys = draw(st.sampled_from([{}, KEYS]))
        text = draw(st.sampled_from(["mid", "", "later"]))
        entries.insert(at, Entry(role=role, parts=[text_part(text)], extra=dict(keys)))
    return entries


@settings(max_examples=300, deadline=None)
@given(histories(), st.booleans())
def test_assembly_equals_the_render(entries: list[Entry], allowed: bool) -> None:
    system, messages = anthropic_format.render_messages(
        pair_tool_calls(entries), system_messages=allowed
    )
    system_json, messages_json, _ = assemble_anthropic(stored(entries), system_messages=allowed)
    assert orjson.loads(system_json) == system
    assert orjson.loads(messages_json) == messages
    if not allowed:
        assert all(m["role"] in ("user", "assistant") for m in messages)


def test_parsing_keeps_the_system_message_and_its_keys() -> None:
    """Stored with its role, its blocks' cache_control and its own keys; matched as the
    same message whether it comes as blocks or as a string (Claude Code sends it both
    ways on successive calls)."""
    as_blocks = {
        "role": "system",
        "content": [{"type": "text", "text": "ctx", "cache_control": {"type": "ephemeral"}}],
        **KEYS,
    }
    as_string = {"role": "system", "content": "ctx", **KEYS}
    [first] = anthropic_format.parse_message(as_blocks, "messages[1]")
    [second] = anthropic_format.parse_message(as_string, "messages[1]")
    assert first.role == "system"
    assert first.parts == [
        {"type": "text", "text": "ctx", "extra": {"cache_control": {"type": "ephemeral"}}}
    ]
    assert first.extra == KEYS
    assert digest(first) == digest(second)
    assert anthropic_format.entry_blocks(first)[-1] == {**KEYS, "type": "message_keys"}


def _headers(beta: str) -> list[tuple[bytes, bytes]]:
    return [(b"anthropic-version", b"2023-06-01"), (b"anthropic-beta", beta.encode())]


def test_what_allows_system_messages() -> None:
    plain = [{"role": "user", "content": "hi"}]
    with_system = [*plain, {"role": "system", "content": "ctx"}]
    allowed = anthropic_format.system_messages_allowed
    assert allowed(plain, _headers("claude-code-20250219, mid-conversation-system-2026-04-07"))
    assert allowed(plain, _headers("mid-conversation-system-2027-01-31"))  # a later version
    # Claude Code 2.1.332 sends them without naming the beta: the request shows them.
    assert allowed(with_system, _headers("claude-code-20250219,per-turn-control-2026-07-01"))
    assert allowed(with_system, [])
    assert not allowed(plain, _headers("mid-conversation-system-clear-at-2026-08-21"))
    assert not allowed(plain, _headers("mid-conversation-tool-changes-2026-07-01"))
    assert not allowed(plain, [])


def test_placement_rules_of_the_check() -> None:
    def msg(role: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": role}]}

    ok = [msg("user"), msg("system"), msg("assistant"), msg("user"), msg("system")]
    assert check_anthropic_roles(ok, system_messages=True) == []
    assert check_anthropic_roles(ok) != []  # not without leave
    for bad in (
        [msg("system"), msg("user")],  # first
        [msg("user"), msg("assistant"), msg("system")],  # after the assistant
        [msg("user"), msg("system"), msg("user")],  # followed by the user
        [msg("user"), msg("system"), msg("system"), msg("assistant")],  # two in a row
    ):
        assert check_anthropic_roles(bad, system_messages=True) != [], bad
