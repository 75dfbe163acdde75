"""Images cost what their model's provider bills (issue 30): each provider's own
rule, checked against the worked examples its documentation gives, and the rule
chosen from the session's model by the catalog."""

from __future__ import annotations

import base64
import struct

import pytest

from app.engine.accounting import catalog
from app.engine.accounting.tokens import (
    IMAGE_UNKNOWN_SIZE_TOKENS,
    ImageRule,
    count_entry,
    count_image,
    count_opaque_block,
    image_tokens,
)
from app.engine.model import Entry


def png(width: int, height: int) -> str:
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    return base64.b64encode(head + struct.pack(">II", width, height) + b"\x08\x02\0\0\0").decode()


# --- OpenAI: platform.openai.com/docs/guides/images-vision, "Calculating costs" -----


@pytest.mark.parametrize(
    ("size", "detail", "expected"),
    [
        # "A 1024 x 1024 square image in detail: high mode costs 765 tokens": 4 tiles + 85.
        ((1024, 1024), "high", 765),
        # "A 2048 x 4096 image in detail: high mode costs 1105 tokens": 1024x2048, then
        # 768x1536, 6 tiles.
        ((2048, 4096), "high", 1105),
        # "A 4096 x 8192 image in detail: low most costs 85 tokens".
        ((4096, 8192), "low", 85),
        # Smaller than a tile: one tile, never scaled up.
        ((100, 100), None, 255),
    ],
)
def test_openai_tiles(size: tuple[int, int], detail: str | None, expected: int) -> None:
    assert image_tokens(size, "openai", detail=detail) == expected


def test_gpt_4o_mini_counts_the_same_tiles_at_its_own_figures() -> None:
    """gpt-4o-mini: 2,833 base, 5,667 a tile (the same table of the same page)."""
    assert image_tokens((1024, 1024), "openai-mini") == 2_833 + 4 * 5_667
    assert image_tokens((4096, 8192), "openai-mini", detail="low") == 2_833


# --- Anthropic: docs.anthropic.com/en/docs/build-with-claude/vision -----------------


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((200, 200), 54),  # the docs' table: "~54"
        ((1000, 1000), 1_334),  # "~1334"
        ((1092, 1092), 1_590),  # "~1590": the largest square sent as it is
    ],
)
def test_anthropic_pixels_over_750(size: tuple[int, int], expected: int) -> None:
    assert image_tokens(size, "anthropic") == expected


def test_anthropic_scales_a_large_image_down_first() -> None:
    """A long edge over 1,568 px, or more than ~1,600 tokens, is scaled down with
    its aspect kept: a 4000x3000 photo costs what ~1.2 megapixels cost, not 16,000."""
    assert 1_500 <= image_tokens((4000, 3000), "anthropic") <= 1_600
    # A 1:4 strip over the long edge: 1568x392 after scaling.
    assert image_tokens((4000, 1000), "anthropic") == -(-(1568 * 392) // 750)
    # OpenAI's detail has no meaning there.
    assert image_tokens((200, 200), "anthropic", detail="low") == 54


# --- Gemini: ai.google.dev/gemini-api/docs/tokens, "Multimodal tokens" --------------


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((384, 384), 258),  # both sides at most 384 px: 258
        ((256, 300), 258),
        ((960, 540), 1_548),  # tiles of 360 px (540 / 1.5): 3 x 2
        ((1920, 1080), 1_548),  # tiles of 720 px: 3 x 2
        ((1000, 1000), 1_032),  # tiles of 666 px: 2 x 2
        ((3840, 2160), 3_870),  # tiles capped at 768 px: 5 x 3
        ((385, 100), 2 * 258),  # tiles at their 256 px floor (100 / 1.5 is less): 2 x 1
    ],
)
def test_gemini_tiles(size: tuple[int, int], expected: int) -> None:
    assert image_tokens(size, "gemini") == expected


# --- Unknown sizes, parts and the catalog ---------------------------------------------


@pytest.mark.parametrize("rule", ["openai", "openai-mini", "anthropic", "gemini"])
def test_an_image_of_unknown_size_costs_the_rules_documented_default(rule: ImageRule) -> None:
    part = {"type": "image", "url": "https://example.test/chart.png"}
    assert count_image(part, rule) == IMAGE_UNKNOWN_SIZE_TOKENS[rule]
    assert IMAGE_UNKNOWN_SIZE_TOKENS[rule] > 0


def test_the_same_image_costs_what_each_provider_bills() -> None:
    part = {"type": "image", "media_type": "image/png", "data": png(1000, 1000)}
    assert count_image(part) == 765  # OpenAI's rule is the default
    assert count_image(part, "anthropic") == 1_334
    assert count_image(part, "gemini") == 1_032
    entry = Entry(role="user", parts=[{"type": "text", "text": "see"}, part])
    base = count_entry(Entry(role="user", parts=[{"type": "text", "text": "see"}]))
    assert count_entry(entry, "o200k_base", "anthropic") == base + 1_334
    assert count_entry(entry, "o200k_base", "gemini") == base + 1_032
    assert count_entry(entry) == base + 765


def test_an_inline_image_kept_opaquely_follows_the_rule_too() -> None:
    """A Files API image is opaque; an Anthropic document's inline image is not; a
    base64 image inside an opaque block (a tool result's content) is counted by the
    rule, the rest of the block as text."""
    block = {
        "type": "search_result",
        "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}],
    }
    without = count_opaque_block(block)
    block["content"][0]["source"]["data"] = png(1000, 1000)  # type: ignore[index]
    assert count_opaque_block(block, "o200k_base", "anthropic") == without + 1_334
    assert count_opaque_block(block, "o200k_base", "gemini") == without + 1_032


@pytest.mark.parametrize(
    ("model", "rule"),
    [
        ("claude-sonnet-4-20250514", "anthropic"),
        ("anthropic/claude-3-5-haiku", "anthropic"),
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "anthropic"),
        ("gemini-2.5-pro", "gemini"),
        ("google/gemini-2.0-flash", "gemini"),
        ("gemma3:27b", "gemini"),
        ("gpt-4o-mini-2024-07-18", "openai-mini"),
        ("gpt-4o", "openai"),
        ("gpt-5", "openai"),
        ("my-own-model", "openai"),  # unknown: OpenAI's rule
    ],
)
def test_the_catalog_picks_the_rule_from_the_model(model: str, rule: ImageRule) -> None:
    assert catalog.lookup(model).images == rule
    assert catalog.image_rule(model) == rule


def test_an_operators_override_keeps_the_models_rule() -> None:
    overrides = catalog.parse_overrides({"claude-sonnet-4": {"context_window": 50_000}})
    spec = catalog.lookup("claude-sonnet-4-5", catalog.Catalog(overrides))
    assert spec.context_window == 50_000
    assert spec.images == "anthropic"
