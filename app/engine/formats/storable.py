"""What cannot be stored as it was sent, and bodies too large in shape to work on.

Policy: such a value is rejected with a 422 that names the field, never altered
and never stored:

- text Postgres refuses: ``\\u0000`` in a JSON body decodes to a NUL that
  neither ``text`` nor ``jsonb`` accepts, and a lone surrogate cannot be encoded
  as UTF-8;
- integers beyond 64 bits, which the JSON encoder cannot write;
- numbers that are not finite: ``NaN``, ``Infinity``, ``-Infinity`` (which
  Python's JSON parser accepts) and literals beyond the double range such as
  ``1e400`` (parsed as infinity). The encoder writes all of them as ``null``.

And, so that one request cannot occupy the service: an array or object with
more items than a limit is refused before anything walks its items, and one
nested more than ``MAX_JSON_DEPTH`` levels deep before anything goes deeper.
"""

from __future__ import annotations

import math
from typing import Any

_INT64 = range(-(2**63), 2**63)

# Deeper than any real message; the JSON encoder stops at 255 levels, and the
# stored forms wrap a client's value in a few levels of their own.
MAX_JSON_DEPTH = 128


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored; remove or escape it"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which is not valid Unicode text"
    return None


_NOT_FINITE = (
    "is not a finite number (NaN, Infinity, or beyond the range of a double such as 1e400), "
    "which JSON cannot carry; send a finite number or a string"
)
_BIG_INT = "is an integer outside the 64-bit range, which cannot be stored"


def find_unstorable(value: Any, path: str, max_items: int | None = None) -> tuple[str, str] | None:
    """The path and reason of the first value (or key) that cannot be stored, or
    of the first array or object with more than ``max_items`` items (checked
    before its items are walked, so a huge one costs nothing to refuse)."""
    return _named(path, _walk(value, max_items, 1, sizes_only=False))


def find_oversized(value: Any, path: str, max_items: int) -> tuple[str, str] | None:
    """The path and size of the first array or object with more than ``max_items``
    items; nothing else is looked at (for JSON kept as text, such as tool-call
    arguments, whose strings are stored escaped)."""
    return _named(path, _walk(value, max_items, 1, sizes_only=True))


def _named(path: str, found: tuple[list[str | int], str] | None) -> tuple[str, str] | None:
    if found is None:
        return None
    steps, reason = found
    where = path
    for step in reversed(steps):
        if isinstance(step, int):
            where += f"[{step}]"
        else:
            where = f"{where}.{step}" if where else step
    return (where or "body", reason)


def _scalar(value: Any) -> str | None:
    """Why a value that is neither an array nor an object cannot be stored."""
    if isinstance(value, str):
        return _bad_text(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if value in _INT64 else _BIG_INT
    if isinstance(value, float):
        return None if math.isfinite(value) else _NOT_FINITE
    return None


# The path is built only for what is found (steps collected on the way out,
# innermost first): most bodies have nothing to find, and some a million items.
def _walk(
    value: Any, max_items: int | None, depth: int, *, sizes_only: bool
) -> tuple[list[str | int], str] | None:
    found: tuple[list[str | int], str] | None
    if depth > MAX_JSON_DEPTH and isinstance(value, dict | list):
        return [], f"nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
    if isinstance(value, dict):
        if max_items is not None and len(value) > max_items:
            return [], f"holds {len(value):,} keys; at most {max_items:,} in any one JSON object"
        for key, item in value.items():
            problem = None if sizes_only else _bad_text(key)
            if problem:
                return [], f"a key {problem.removeprefix('contains ')}"
            if isinstance(item, dict | list):
                found = _walk(item, max_items, depth + 1, sizes_only=sizes_only)
            elif sizes_only:
                continue
            else:
                reason = _scalar(item)
                found = None if reason is None else ([], reason)
            if found:
                found[0].append(key)
                return found
        return None
    if isinstance(value, list):
        if max_items is not None and len(value) > max_items:
            return [], f"holds {len(value):,} items; at most {max_items:,} in any one JSON array"
        for i, item in enumerate(value):
            kind = type(item)
            if kind is int:  # the common large case: a long array of numbers
                if sizes_only or item in _INT64:
                    continue
                found = ([], _BIG_INT)
            elif kind is dict or kind is list:
                found = _walk(item, max_items, depth + 1, sizes_only=sizes_only)
            elif sizes_only:
                continue
            else:
                reason = _scalar(item)
                found = None if reason is None else ([], reason)
            if found:
                found[0].append(i)
                return found
        return None
    reason = None if sizes_only else _scalar(value)
    return None if reason is None else ([], reason)
