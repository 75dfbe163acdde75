"""The largest requests the service accepts, and hostile ones of the same size: for
the request-bounds tests and the benchmark (``bench``), which send them over HTTP
while other clients poll, and report what the others waited."""

from __future__ import annotations

import functools
import random
import string
from typing import Any

import orjson

# Text that costs the most to count per byte: printable ASCII in no pattern
# (about 0.75 tokens a byte), without the characters JSON escapes (so a byte of
# text is a byte of body).
_ALPHABET = "".join(c for c in string.printable if c not in '"\\' and c.isprintable())


def _text(rng: random.Random, size: int) -> str:
    """``size`` characters at a random place of one random block: as costly to count
    as fresh random text, and far quicker to make."""
    block = _block()
    start = rng.randrange(len(block))
    return (block * (2 + size // len(block)))[start : start + size]


@functools.cache
def _block() -> str:
    return "".join(random.Random(0).choices(_ALPHABET, k=1 << 18))


def max_size_append(max_body_bytes: int, max_messages: int, tag: str = "big") -> bytes:
    """An OpenAI-format append of ``max_messages`` messages (assistant tool calls and
    the tool results that answer them) whose JSON body is just under
    ``max_body_bytes``: the most work one accepted append can ask for. Tool results
    over the ingest truncation cap are truncated as well as counted."""
    rng = random.Random(f"{tag}-{max_body_bytes}-{max_messages}")
    pairs = max_messages // 2

    def build(text_bytes: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for k in range(pairs):
            call_id = f"{tag}-{k}"
            messages.append(
                {
                    "role": "assistant",
                    "content": _text(rng, text_bytes // 8),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": orjson.dumps({"command": _text(rng, 40)}).decode(),
                            },
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(rng, text_bytes)}
            )
        if max_messages % 2:
            messages.append({"role": "user", "content": _text(rng, text_bytes)})
        return messages

    empty = len(orjson.dumps({"messages": build(0)}))
    # Each pair carries 9/8 of text_bytes; leave a little room for the rounding.
    per = max(0, (max_body_bytes - empty - 1024) * 8 // (9 * max(1, max_messages - pairs)))
    body = orjson.dumps({"messages": build(per)})
    assert len(body) <= max_body_bytes, (len(body), max_body_bytes)
    return body


def million_integers() -> bytes:
    """One million integers as ``messages``: 2 MB."""
    return b'{"messages": [' + b",".join([b"1"] * 1_000_000) + b"]}"


def arguments_with_array(items: int, fmt: str = "openai") -> bytes:
    """An assistant tool call whose arguments hold an array of ``items`` integers
    (an OpenAI ``arguments`` string, or an Anthropic ``tool_use`` input), and its result."""
    values = list(range(items))
    if fmt == "openai":
        messages: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_many",
                        "type": "function",
                        "function": {
                            "name": "plot",
                            "arguments": orjson.dumps({"values": values}).decode(),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_many", "content": "plotted"},
        ]
    else:
        messages = [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_many",
                        "name": "plot",
                        "input": {"values": values},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_many", "content": "plotted"}
                ],
            },
        ]
    return orjson.dumps({"format": fmt, "messages": messages})
