"""What Postgres cannot store: NUL characters and lone UTF-16 surrogates.

Policy: such text is rejected with a 422 that names the field, never altered
and never stored. ``\\u0000`` in a JSON body decodes to a NUL that neither
``text`` nor ``jsonb`` accepts, and a lone surrogate cannot be encoded as UTF-8.
"""

from __future__ import annotations

import array
import itertools
import re
from typing import Any

_INT64 = range(-(2**63), 2**63)

# Deeper than any real message; the JSON encoder stops at 255 levels, and the
# stored forms wrap a client's value in a few levels of their own.
MAX_JSON_DEPTH = 128

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def nests_too_deep(body: bytes) -> bool:
    """Whether a raw JSON body nests arrays and objects deeper than
    ``MAX_JSON_DEPTH`` (brackets inside strings do not count). Most bodies have
    fewer brackets than that in all; the rest are scanned in C: strings go
    first, then the brackets become +1/-1 steps whose running sum is the depth."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return False
    steps = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS).translate(_BRACKETS)
    return max(itertools.accumulate(array.array("b", steps)), default=0) > MAX_JSON_DEPTH


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


def find_unstorable(value: Any, path: str) -> tuple[str, str] | None:
    """The path and reason of the first string (or key) that cannot be stored."""
    if isinstance(value, str):
        problem = _bad_text(value)
        return (path, problem) if problem else None
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        return (path or "body", "is an integer outside the 64-bit range, which cannot be stored")
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _bad_text(key)
            if problem:
                return (path or "body", f"a key {problem.removeprefix('contains ')}")
            found = find_unstorable(item, f"{path}.{key}" if path else key)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_unstorable(item, f"{path}[{i}]")
            if found:
                return found
    return None
