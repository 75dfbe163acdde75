"""What cannot be stored as sent: NUL characters, lone surrogates, integers beyond
64 bits, numbers that are not finite; and arrays or objects over the item cap."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats.storable import find_oversized, find_unstorable


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
    STORABLE
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none(),
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


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"metadata": {"x": NaN}}', "metadata.x"),
        (b'{"a": [1, Infinity]}', "a[1]"),
        (b'{"a": {"b": [{"c": -Infinity}]}}', "a.b[0].c"),
        (b'{"n": 1e400}', "n"),  # beyond a double: Python parses it as inf
        (b'{"n": -1e400}', "n"),
        (b"[NaN]", "[0]"),
        (b"NaN", "body"),
    ],
)
def test_numbers_that_are_not_finite_are_named(raw: bytes, path: str) -> None:
    """Python's JSON parser takes them; the JSON encoder would write them as null."""
    found = find_unstorable(json.loads(raw), "")
    assert found is not None
    assert found[0] == path
    assert "not a finite number" in found[1]


def test_finite_floats_pass() -> None:
    value = json.loads(b"[1e308, -1e308, 5e-324, -0.0, 0.5, 1e-400]")
    assert find_unstorable(value, "") is None


def test_an_array_or_object_over_the_cap_is_named_before_its_items_are_walked() -> None:
    # A bad value deep inside is not what is reported: the size is, and at once.
    big = [1] * 1_000_000 + [float("nan")]
    found = find_unstorable({"messages": [{"input": {"values": big}}]}, "", max_items=10_000)
    assert found == (
        "messages[0].input.values",
        "holds 1,000,001 items; at most 10,000 in any one JSON array",
    )
    wide = {"metadata": {f"k{i}": i for i in range(11)}}
    assert find_unstorable(wide, "", max_items=10) == (
        "metadata",
        "holds 11 keys; at most 10 in any one JSON object",
    )
    assert find_unstorable(wide, "", max_items=11) is None
    assert find_unstorable(wide, "") is None  # no cap
    assert find_unstorable([[1] * 5], "", max_items=4) == (
        "[0]",
        "holds 5 items; at most 4 in any one JSON array",
    )


def test_oversized_looks_at_sizes_only() -> None:
    """For JSON kept as text (tool-call arguments), only the size of its arrays and
    objects counts: the text itself is what is stored."""
    value = {"path": "a\x00b", "rows": [[float("nan"), 2**70], [3, 4, 5]]}
    assert find_unstorable(value, "") is not None
    assert find_oversized(value, "args", 3) is None
    assert find_oversized(value, "args", 2) == (
        "args.rows[1]",
        "holds 3 items; at most 2 in any one JSON array",
    )
