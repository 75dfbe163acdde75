"""Hypothesis strategies for OpenAI and Anthropic conversations and canonical entries."""

from __future__ import annotations

import base64
import json
import string
from functools import cache
from typing import Any

from hypothesis import strategies as st

from app.engine.model import Entry

JSON = Any

# Small alphabets keep the examples readable; text() alone already covers Unicode.
NAMES = st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=12)
TEXTS = st.text(max_size=12)

JSON_SCALARS: st.SearchStrategy[JSON] = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
JSON_VALUES: st.SearchStrategy[JSON] = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=5,
)
JSON_OBJECTS: st.SearchStrategy[dict[str, JSON]] = st.dictionaries(
    st.text(max_size=8), JSON_VALUES, max_size=4
)


@cache
def extras(*keys: str) -> st.SearchStrategy[dict[str, JSON]]:
    """Unknown keys a client may send; they must survive the history render."""
    return st.dictionaries(st.sampled_from(keys), JSON_VALUES, max_size=2)


PNG_1x1 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000000000200015e1d0a2d0000000049454e44ae426082"
    )
).decode()

B64_DATA = st.sampled_from([PNG_1x1, "R0lGODlhAQABAAAAACw=", "/9j/4AAQSkZJRgABAQ=="])
MEDIA_TYPES = st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"])
HTTP_URLS = st.sampled_from(
    ["https://example.com/cat.png", "https://img.example.org/a/b.jpg?x=1", "http://h/i.gif"]
)


@st.composite
def data_urls(draw: st.DrawFn) -> str:
    return f"data:{draw(MEDIA_TYPES)};base64,{draw(B64_DATA)}"


class Ids:
    """Unique tool-call ids within one generated conversation."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.n = 0

    def next(self) -> str:
        self.n += 1
        return f"{self.prefix}_{self.n}"


# --- OpenAI -----------------------------------------------------------------------------

MESSAGE_EXTRA_KEYS = ("extra", "index", "x_trace")


@st.composite
def openai_text_part(draw: st.DrawFn) -> dict[str, JSON]:
    return {"type": "text", "text": draw(TEXTS), **draw(extras("extra", "index", "cache_control"))}


@st.composite
def openai_image_part(draw: st.DrawFn) -> dict[str, JSON]:
    image: dict[str, JSON] = {"url": draw(data_urls() | HTTP_URLS)}
    detail = draw(st.sampled_from([None, "low", "high", "auto"]))
    if detail is not None:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image, **draw(extras("extra", "index"))}


@cache
def openai_content(*, images: bool) -> st.SearchStrategy[JSON]:
    part = openai_text_part() | openai_image_part() if images else openai_text_part()
    return TEXTS | st.lists(part, max_size=3)


OPENAI_TEXT_PARTS = st.lists(openai_text_part(), max_size=2)


@st.composite
def openai_simple_message(draw: st.DrawFn, role: str) -> dict[str, JSON]:
    msg: dict[str, JSON] = {"role": role, "content": draw(openai_content(images=role == "user"))}
    if draw(st.booleans()):
        msg["name"] = draw(NAMES)
    msg.update(draw(extras(*MESSAGE_EXTRA_KEYS)))
    return msg


@st.composite
def openai_tool_call(draw: st.DrawFn, call_id: str, index: int) -> dict[str, JSON]:
    args = draw(JSON_OBJECTS)
    # Keep the client's exact spelling of the arguments: compact, spaced or empty.
    arguments = draw(
        st.sampled_from(
            [json.dumps(args), json.dumps(args, separators=(",", ":"), ensure_ascii=False)]
            + ([""] if not args else [])
        )
    )
    call: dict[str, JSON] = {
        "id": call_id,
        "type": "function",
        "function": {"name": draw(NAMES), "arguments": arguments},
    }
    if draw(st.booleans()):
        call["index"] = index
    call.update(draw(extras("extra")))
    if draw(st.integers(0, 4)) == 0:
        call["function"]["x_fn"] = draw(JSON_SCALARS)
    return call


@st.composite
def openai_assistant(draw: st.DrawFn, call_ids: list[str]) -> dict[str, JSON]:
    msg: dict[str, JSON] = {"role": "assistant"}
    content_kind = draw(st.sampled_from(["absent", "null", "string", "parts"]))
    if content_kind == "null":
        msg["content"] = None
    elif content_kind == "string":
        msg["content"] = draw(TEXTS)
    elif content_kind == "parts":
        msg["content"] = draw(OPENAI_TEXT_PARTS)
    if draw(st.booleans()):
        msg["reasoning_content"] = draw(TEXTS)
    if call_ids:
        msg["tool_calls"] = [draw(openai_tool_call(cid, i)) for i, cid in enumerate(call_ids)]
    if draw(st.booleans()):
        msg["name"] = draw(NAMES)
    msg.update(draw(extras(*MESSAGE_EXTRA_KEYS)))
    return msg


@st.composite
def openai_tool_result(draw: st.DrawFn, call_id: str) -> dict[str, JSON]:
    msg: dict[str, JSON] = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": draw(openai_content(images=True)),
    }
    msg.update(draw(extras(*MESSAGE_EXTRA_KEYS)))
    return msg


@st.composite
def openai_conversations(draw: st.DrawFn) -> list[dict[str, JSON]]:
    """A valid OpenAI conversation: every tool call answered right after its message."""
    ids = Ids("call")
    msgs: list[dict[str, JSON]] = []
    if draw(st.booleans()):
        msgs.append(draw(openai_simple_message(draw(st.sampled_from(["system", "developer"])))))
    for _ in range(draw(st.integers(1, 3))):
        msgs.append(draw(openai_simple_message("user")))
        for _ in range(draw(st.integers(0, 2))):
            call_ids = [ids.next() for _ in range(draw(st.integers(1, 3)))]
            msgs.append(draw(openai_assistant(call_ids)))
            for cid in draw(st.permutations(call_ids)):
                msgs.append(draw(openai_tool_result(cid)))
        msgs.append(draw(openai_assistant([])))
    return msgs


# --- Anthropic --------------------------------------------------------------------------


@st.composite
def anthropic_text_block(draw: st.DrawFn) -> dict[str, JSON]:
    return {"type": "text", "text": draw(TEXTS), **draw(extras("cache_control", "citations"))}


@st.composite
def anthropic_image_block(draw: st.DrawFn) -> dict[str, JSON]:
    source: dict[str, JSON]
    if draw(st.booleans()):
        source = {"type": "base64", "media_type": draw(MEDIA_TYPES), "data": draw(B64_DATA)}
    else:
        source = {"type": "url", "url": draw(HTTP_URLS)}
    return {"type": "image", "source": source, **draw(extras("cache_control"))}


ANTHROPIC_USER_BLOCKS = st.lists(anthropic_text_block() | anthropic_image_block(), max_size=3)
ANTHROPIC_RESULT_CONTENT = TEXTS | ANTHROPIC_USER_BLOCKS
ANTHROPIC_TEXT_BLOCKS = st.lists(anthropic_text_block(), max_size=2)


@st.composite
def anthropic_tool_result(draw: st.DrawFn, tool_use_id: str) -> dict[str, JSON]:
    block: dict[str, JSON] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": draw(ANTHROPIC_RESULT_CONTENT),
    }
    if draw(st.booleans()):
        block["is_error"] = True
    block.update(draw(extras("cache_control")))
    return block


@st.composite
def anthropic_user(draw: st.DrawFn, answering: list[str]) -> dict[str, JSON]:
    content: JSON
    if answering:
        content = [draw(anthropic_tool_result(i)) for i in draw(st.permutations(answering))]
        content += draw(ANTHROPIC_USER_BLOCKS)
    else:
        content = draw(ANTHROPIC_RESULT_CONTENT)
    return {"role": "user", "content": content, **draw(extras("metadata", "x_trace"))}


@st.composite
def anthropic_assistant(draw: st.DrawFn, use_ids: list[str]) -> dict[str, JSON]:
    if not use_ids and draw(st.booleans()):
        return {"role": "assistant", "content": draw(TEXTS), **draw(extras("x_trace"))}
    blocks: list[dict[str, JSON]] = []
    reasoning = draw(st.sampled_from(["none", "signed", "unsigned", "redacted"]))
    if reasoning == "signed":
        blocks.append({"type": "thinking", "thinking": draw(TEXTS), "signature": draw(NAMES)})
    elif reasoning == "unsigned":
        blocks.append({"type": "thinking", "thinking": draw(TEXTS)})
    elif reasoning == "redacted":
        blocks.append({"type": "redacted_thinking", "data": draw(NAMES)})
    blocks += draw(ANTHROPIC_TEXT_BLOCKS)
    for use_id in use_ids:
        block: dict[str, JSON] = {
            "type": "tool_use",
            "id": use_id,
            "name": draw(NAMES),
            "input": draw(JSON_OBJECTS),
        }
        block.update(draw(extras("cache_control")))
        blocks.append(block)
    return {"role": "assistant", "content": blocks, **draw(extras("x_trace"))}


@st.composite
def anthropic_conversations(draw: st.DrawFn) -> list[dict[str, JSON]]:
    """Alternating user/assistant; every tool_use answered in the next user message."""
    ids = Ids("toolu")
    msgs: list[dict[str, JSON]] = []
    pending: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        msgs.append(draw(anthropic_user(pending)))
        pending = [ids.next() for _ in range(draw(st.integers(0, 3)))]
        msgs.append(draw(anthropic_assistant(pending)))
    if pending:
        msgs.append(draw(anthropic_user(pending)))
    return msgs


# --- Canonical entries for pairing ------------------------------------------------------


def text_part(text: str) -> dict[str, JSON]:
    return {"type": "text", "text": text}


def call_part(call_id: str) -> dict[str, JSON]:
    return {"type": "tool_call", "id": call_id, "name": "run", "arguments": '{"n": 1}'}


def tool_entry(call_id: str) -> Entry:
    return Entry(role="tool", parts=[text_part(f"result of {call_id}")], tool_call_id=call_id)


@st.composite
def messy_histories(draw: st.DrawFn) -> list[Entry]:
    """Entries whose tool results may be missing, duplicated, misplaced or orphaned."""
    ids = Ids("c")
    base: list[Entry] = []
    if draw(st.booleans()):
        base.append(Entry(role="system", parts=[text_part("be brief")], content_form="string"))
    all_calls: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        role = draw(st.sampled_from(["user", "assistant", "assistant"]))
        if role == "user":
            base.append(Entry(role="user", parts=[text_part(draw(TEXTS))], content_form="string"))
            continue
        parts: list[dict[str, JSON]] = []
        if draw(st.booleans()):
            parts.append({"type": "reasoning", "text": "hmm"})
        if draw(st.booleans()):
            parts.append(text_part(draw(TEXTS)))
        calls = [ids.next() for _ in range(draw(st.integers(0, 3)))]
        parts += [call_part(c) for c in calls]
        all_calls += calls
        base.append(Entry(role="assistant", parts=parts, content_form="null"))

    results: list[Entry] = []
    for call_id in all_calls:
        copies = draw(st.sampled_from([0, 1, 1, 1, 2]))  # missing, answered, answered twice
        results += [tool_entry(call_id) for _ in range(copies)]
    results += [tool_entry(f"orphan_{i}") for i in range(draw(st.integers(0, 2)))]

    # Scatter each result anywhere: right after its call, later, or even before it.
    history = list(base)
    for result in results:
        history.insert(draw(st.integers(0, len(history))), result)
    if draw(st.booleans()):
        # Often keep results right behind their call, the common case.
        history = base[:]
        for result in results:
            owner = next(
                (
                    k
                    for k, e in enumerate(history)
                    if e.role == "assistant"
                    and any(c["id"] == result.tool_call_id for c in e.tool_calls())
                ),
                len(history) - 1,
            )
            history.insert(owner + 1, result)
    return history
