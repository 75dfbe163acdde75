"""Text Postgres cannot store: NUL characters and lone surrogates."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.storable import find_unstorable


def test_nul_is_found_with_its_path() -> None:
    value = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "a\x00b"}]}
    found = find_unstorable(value, "")
    assert found is not None
    assert found[0] == "messages[1].content"
    assert "NUL" in found[1]


def test_lone_surrogate_is_found_with_its_path() -> None:
    value = json.loads('{"messages": [{"content": [{"type": "text", "text": "x\\ud800y"}]}]}')
    found = find_unstorable(value, "body")
    assert found is not None
    assert found[0] == "body.messages[0].content[0].text"
    assert "surrogate" in found[1]


def test_bad_key_is_reported_on_its_object() -> None:
    found = find_unstorable({"messages": [{"a\x00": 1}]}, "")
    assert found is not None
    assert found[0] == "messages[0]"
    assert found[1].startswith("a key a NUL")
    assert find_unstorable({"\ud800": 1}, "")[0] == "body"  # type: ignore[index]


@pytest.mark.parametrize(
    "raw",
    [
        rb'{"t": "\u0000"}',
        rb'{"t": "\\\u0000"}',  # an escaped backslash, then a real escape
        rb'{"t": "\ud800"}',
        rb'{"t": "\uDBFF"}',
    ],
)
def test_real_escapes_are_found(raw: bytes) -> None:
    assert find_unstorable(json.loads(raw), "") is not None


def test_escaped_backslash_u0000_is_plain_text() -> None:
    raw = rb'{"t": "C:\\u0000 and \\\\u0000"}'  # a backslash followed by the letters u0000
    value = json.loads(raw)
    assert value["t"] == "C:\\u0000 and \\\\u0000"
    assert find_unstorable(value, "") is None


def test_valid_surrogate_pair_is_fine() -> None:
    raw = rb'{"t": "smile \ud83d\ude00"}'
    value = json.loads(raw)
    assert value["t"] == "smile \U0001f600"
    assert find_unstorable(value, "") is None
    assert find_unstorable({"t": "\U0001f600"}, "") is None


STORABLE = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20)
JSONISH: st.SearchStrategy[Any] = st.recursive(
    STORABLE | st.integers(-(2**63), 2**63 - 1) | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STORABLE, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(JSONISH)
def test_storable_values_pass(value: Any) -> None:
    assert find_unstorable(value, "") is None
    # And so does the same value as a client's JSON decodes it.
    assert find_unstorable(json.loads(json.dumps(value)), "") is None


def test_integers_beyond_64_bits_are_named() -> None:
    assert find_unstorable({"a": [1, 2**63]}, "") == (
        "a[1]",
        "is an integer outside the 64-bit range, which cannot be stored",
    )
    assert find_unstorable({"a": [-(2**63), 2**63 - 1, True]}, "") is None
    assert find_unstorable(json.loads(b'{"n": 9223372036854775808}'), "") is not None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(STORABLE, min_size=1, max_size=5),
    st.data(),
    st.sampled_from(["\x00", "\ud800", "\udfff"]),
)
def test_first_bad_string_is_named(texts: list[str], data: st.DataObject, bad: str) -> None:
    i = data.draw(st.integers(0, len(texts) - 1))
    at = data.draw(st.integers(0, len(texts[i])))
    texts[i] = texts[i][:at] + bad + texts[i][at:]
    body = {"messages": [{"content": t} for t in texts]}
    found = find_unstorable(body, "")
    assert found is not None
    assert found[0] == f"messages[{i}].content"
    assert find_unstorable(json.loads(json.dumps(body)), "") == found
