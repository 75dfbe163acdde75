"""Token counting: offline tiktoken files, text, framing and image costs."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import struct
import zlib
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import tokenizer
from app.engine.accounting import tokens
from app.engine.accounting.tokens import count_entry, count_image, count_text
from app.engine.model import Entry
from tests.tiktoken_cache import install_offline_encodings

# The files tiktoken downloads and the sha256 it insists on (tiktoken_ext/openai_public.py).
FILES = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        199_998,
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        100_256,
    ),
}


class NetworkUsedError(RuntimeError):
    pass


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder; any attempt of tiktoken to download fails the test."""

    def no_network(blobpath: str) -> bytes:
        raise NetworkUsedError(blobpath)

    # Registered so that the variable install_offline_encodings sets is restored afterwards.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    return tmp_path / "tiktoken"


@pytest.mark.parametrize("name", sorted(FILES))
def test_installed_files_are_the_ones_tiktoken_verifies(offline_cache: Path, name: str) -> None:
    install_offline_encodings(offline_cache)
    url, sha256, size = FILES[name]
    cached = offline_cache / hashlib.sha1(url.encode()).hexdigest()
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha256
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(offline_cache)
    ranks = tiktoken.load.load_tiktoken_bpe(url, expected_hash=sha256)  # no download: guarded
    assert len(ranks) == size
    assert ranks[b"hello"] == tiktoken.get_encoding(name).encode_single_token(b"hello")


def test_install_writes_only_the_expected_files_and_is_idempotent(offline_cache: Path) -> None:
    install_offline_encodings(offline_cache)
    install_offline_encodings(offline_cache)
    expected = {hashlib.sha1(url.encode()).hexdigest() for url, _, _ in FILES.values()}
    assert {p.name for p in offline_cache.iterdir()} == expected


def test_tiktoken_rejects_a_corrupted_cache_file(offline_cache: Path) -> None:
    install_offline_encodings(offline_cache)
    url, sha256, _ = FILES["o200k_base"]
    cached = offline_cache / hashlib.sha1(url.encode()).hexdigest()
    cached.write_bytes(cached.read_bytes()[:-10])  # truncated
    with pytest.raises(NetworkUsedError):
        tiktoken.load.load_tiktoken_bpe(url, expected_hash=sha256)


def test_install_repairs_a_corrupted_cache_file(offline_cache: Path) -> None:
    install_offline_encodings(offline_cache)
    url, sha256, _ = FILES["cl100k_base"]
    cached = offline_cache / hashlib.sha1(url.encode()).hexdigest()
    cached.write_bytes(b"garbage")
    install_offline_encodings(offline_cache)  # e.g. the next start of the service
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha256
    assert (
        len(tiktoken.load.load_tiktoken_bpe(url, expected_hash=sha256)) == FILES["cl100k_base"][2]
    )


# --- the encodings the service counts with, built in memory -----------------------------


@pytest.mark.parametrize("name", sorted(FILES))
def test_built_encodings_are_tiktokens_own(name: str) -> None:
    """The same pattern, special tokens and ranks as tiktoken's get_encoding (which
    loads the rank file the test run installed, with tiktoken's own hash check)."""
    built = tokenizer.build_encoding(name)
    reference = tiktoken.get_encoding(name)
    assert built.name == reference.name
    assert built._pat_str == reference._pat_str
    assert built._special_tokens == reference._special_tokens
    assert built._mergeable_ranks == reference._mergeable_ranks
    assert built.n_vocab == reference.n_vocab
    assert len(built._mergeable_ranks) == FILES[name][2]


def test_building_uses_no_network_no_cache_and_no_environment(
    offline_cache: Path, tmp_path: Path
) -> None:
    """With tiktoken's downloads failing and its cache folder empty, the encodings still
    build; no file is written and the environment is left as it was."""
    before = dict(os.environ)
    for name in FILES:
        assert tokenizer.build_encoding(name).encode_ordinary("hello world") == (
            tiktoken.get_encoding(name).encode_ordinary("hello world")
        )
    assert list(tmp_path.iterdir()) == []  # the cache folder the fixture names stays unmade
    assert not offline_cache.exists()
    assert dict(os.environ) == before


def test_a_bundled_file_without_the_expected_hash_is_refused() -> None:
    url, sha256, _ = FILES["cl100k_base"]
    assert len(tokenizer.bundled_ranks(url, sha256)) == FILES["cl100k_base"][2]
    with pytest.raises(ValueError, match="sha256"):
        tokenizer.bundled_ranks(url, FILES["o200k_base"][1])
    with pytest.raises(ValueError, match="sha256"):
        tokenizer.bundled_ranks(url, None)


def test_encodings_are_built_once_per_process() -> None:
    first = tokenizer.load_encodings()
    assert [e.name for e in first] == ["o200k_base", "cl100k_base"]
    assert all(a is b for a, b in zip(first, tokenizer.load_encodings(), strict=True))
    # What conftest registered, as the app's start-up does.
    assert tokens.get_encoding("o200k_base") is first[0]
    assert tokens.get_encoding("cl100k_base") is first[1]


def test_counting_without_registered_encodings_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens, "_encodings", {})  # a process that registered none
    with pytest.raises(LookupError, match=r"no o200k_base encoding.*register_encodings"):
        count_text("hello")
    tokens.register_encodings(tokenizer.load_encodings())
    assert count_text("hello world") == 2


# --- text -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_known_counts(encoding: tokens.EncodingName) -> None:
    assert count_text("", encoding) == 0
    assert count_text("hello world", encoding) == 2
    assert count_text("hello world " * 100, encoding) > 100


def test_encodings_differ_where_they_should() -> None:
    text = "Привет, как дела? 你好世界"
    assert count_text(text, "o200k_base") < count_text(text, "cl100k_base")


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_special_token_text_is_counted_as_plain_text(encoding: tokens.EncodingName) -> None:
    # A user pasting "<|endoftext|>" must not make counting fail.
    assert count_text("<|endoftext|>", encoding) > 1


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["o200k_base", "cl100k_base"]))
def test_count_text_is_the_encoded_length(text: str, encoding: tokens.EncodingName) -> None:
    reference = tiktoken.get_encoding(encoding)
    assert count_text(text, encoding) == len(reference.encode(text, disallowed_special=()))


# --- entries ----------------------------------------------------------------------------


def test_count_entry_adds_framing() -> None:
    entry = Entry(role="user", parts=[{"type": "text", "text": "hello world"}])
    assert count_entry(entry) == 3 + 2
    assert count_entry(Entry(role="user", parts=[])) == 3
    named = Entry(role="user", parts=[{"type": "text", "text": "hello world"}], name="bob")
    assert count_entry(named) == 3 + 2 + 1 + count_text("bob")


def test_count_entry_counts_tool_call_name_and_arguments() -> None:
    name, arguments = "get_weather", '{"city": "Paris", "unit": "celsius"}'
    call = {"type": "tool_call", "id": "call_1", "name": name, "arguments": arguments}
    entry = Entry(role="assistant", parts=[{"type": "text", "text": "hello world"}, call])
    assert count_entry(entry) == 3 + 2 + 8 + count_text(name) + count_text(arguments)
    assert count_text(arguments) > 5
    # Longer arguments cost more.
    longer = dict(call, arguments='{"city": "Paris", "unit": "celsius", "days": [1, 2, 3, 4, 5]}')
    assert count_entry(Entry(role="assistant", parts=[longer])) > count_entry(
        Entry(role="assistant", parts=[call])
    )


def test_count_entry_counts_tool_result_id_and_reasoning() -> None:
    result = Entry(
        role="tool", parts=[{"type": "text", "text": "hello world"}], tool_call_id="call_1"
    )
    assert count_entry(result) == 3 + 2 + count_text("call_1")
    thinking = Entry(role="assistant", parts=[{"type": "reasoning", "text": "hello world"}])
    assert count_entry(thinking) == 3 + 2
    redacted = Entry(role="assistant", parts=[{"type": "reasoning", "redacted": "hello world"}])
    assert count_entry(redacted) == 3 + 2


def opaque_blob(chars: int) -> str:
    """Base64 of random bytes, like an encrypted reasoning block."""
    return base64.b64encode(random.Random(chars).randbytes(chars * 3 // 4)).decode()[:chars]


def test_an_opaque_part_is_an_estimate_capped_per_part() -> None:
    """Seed 000's MAX_TOKENS_PER_PART: one odd part cannot make the verdict jump."""
    blob = opaque_blob(2_000_000)  # ~1.5 MB of encrypted reasoning: far over 50k tokens
    assert count_text(blob) > tokens.MAX_TOKENS_PER_PART
    redacted = Entry(role="assistant", parts=[{"type": "reasoning", "redacted": blob}])
    assert count_entry(redacted) == 3 + tokens.MAX_TOKENS_PER_PART
    # Below the cap it is the plain count, as before.
    small = opaque_blob(4_000)
    assert tokens.count_opaque(small) == count_text(small)
    # Two such parts are capped each, not together.
    two = Entry(
        role="assistant",
        parts=[{"type": "reasoning", "redacted": blob}, {"type": "reasoning", "redacted": blob}],
    )
    assert count_entry(two) == 3 + 2 * tokens.MAX_TOKENS_PER_PART


def test_counted_text_is_exact_and_never_capped() -> None:
    """A text counted with tiktoken is exact: no cap, however long (reasoning,
    message text and tool arguments alike)."""
    text = opaque_blob(400_000)
    exact = count_text(text)
    assert exact > tokens.MAX_TOKENS_PER_PART
    assert count_entry(Entry(role="user", parts=[{"type": "text", "text": text}])) == 3 + exact
    thinking = Entry(role="assistant", parts=[{"type": "reasoning", "text": text}])
    assert count_entry(thinking) == 3 + exact
    call = {"type": "tool_call", "id": "c", "name": "f", "arguments": f'{{"a": "{text}"}}'}
    assert count_entry(Entry(role="assistant", parts=[call])) > 3 + exact


def test_an_estimate_is_capped_and_a_small_one_kept() -> None:
    assert tokens.capped_estimate(10**9) == tokens.MAX_TOKENS_PER_PART
    assert tokens.capped_estimate(tokens.MAX_TOKENS_PER_PART + 1) == tokens.MAX_TOKENS_PER_PART
    assert tokens.capped_estimate(765) == 765


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_count_entry_uses_the_encoding(encoding: tokens.EncodingName) -> None:
    text = "Привет, как дела? 你好世界"
    entry = Entry(role="user", parts=[{"type": "text", "text": text}])
    assert count_entry(entry, encoding) == 3 + count_text(text, encoding)


# --- images -----------------------------------------------------------------------------


def png(width: int, height: int) -> str:
    ihdr = struct.pack(">II", width, height) + bytes([8, 6, 0, 0, 0])
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk + b"\x00" * 32).decode()


def gif(width: int, height: int) -> str:
    return base64.b64encode(b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 16).decode()


def jpeg(width: int, height: int) -> str:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, height, width) + b"\x00" * 10
    return base64.b64encode(b"\xff\xd8" + app0 + sof + b"\x00" * 16).decode()


@pytest.mark.parametrize(
    ("width", "height", "expected"),
    [
        (1024, 1024, 765),  # 768x768 -> 4 tiles
        (512, 512, 255),  # one tile, never upscaled
        (100, 100, 255),
        (2048, 4096, 1105),  # fit 1024x2048 -> 768x1536 -> 2x3 tiles
        (4096, 8192, 1105),
        (1600, 900, 1105),  # 1365x768 -> 3x2 tiles
        (513, 512, 425),  # just over one tile wide -> 2 tiles
    ],
)
def test_png_data_url_uses_the_tile_formula(width: int, height: int, expected: int) -> None:
    assert (
        count_image({"type": "image", "url": f"data:image/png;base64,{png(width, height)}"})
        == expected
    )
    assert (
        count_image({"type": "image", "media_type": "image/png", "data": png(width, height)})
        == expected
    )


def test_gif_and_jpeg_sizes_are_read() -> None:
    assert (
        count_image({"type": "image", "media_type": "image/gif", "data": gif(2048, 4096)}) == 1105
    )
    assert (
        count_image({"type": "image", "media_type": "image/jpeg", "data": jpeg(2048, 4096)}) == 1105
    )


def test_low_detail_is_flat() -> None:
    big = f"data:image/png;base64,{png(4096, 4096)}"
    assert count_image({"type": "image", "url": big, "detail": "low"}) == 85
    assert count_image({"type": "image", "url": "https://x.test/a.png", "detail": "low"}) == 85


def test_unknown_size_costs_a_default_high_detail_image() -> None:
    assert count_image({"type": "image", "url": "https://x.test/a.png"}) == 765
    assert count_image({"type": "image", "media_type": "image/webp", "data": "UklGRg=="}) == 765
    assert count_image({"type": "image", "url": "data:image/png;base64,!!!not base64"}) == 765
    assert count_image({"type": "image", "url": f"data:image/png;base64,{png(0, 10)}"}) == 765


def test_image_part_counts_in_an_entry() -> None:
    entry = Entry(
        role="user", parts=[{"type": "image", "url": "https://x.test/a.png", "detail": "low"}]
    )
    assert count_entry(entry) == 3 + 85


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000))
def test_any_png_costs_whole_tiles_within_bounds(width: int, height: int) -> None:
    cost = count_image({"type": "image", "media_type": "image/png", "data": png(width, height)})
    tiles, rest = divmod(cost - 85, 170)
    assert rest == 0
    assert 1 <= tiles <= 8  # at most 768x2048 after scaling: 2x4 tiles
    if max(width, height) <= 512:
        assert tiles == 1
