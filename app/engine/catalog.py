"""The model catalog: context window, max output and tokenizer per model family.

Lookup is by longest matching prefix of the model name, after dropping a
provider prefix (``openai/``, ``anthropic/``, ``bedrock/…``) and lower-casing,
so dated snapshots (``claude-sonnet-4-20250514``) and provider spellings
(``openrouter/anthropic/claude-sonnet-4``) find their family. Unknown models
get a 128,000-token window.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from app.engine.tokens import EncodingName

UNKNOWN_CONTEXT_WINDOW = 128_000
UNKNOWN_MAX_OUTPUT = 16_384


@dataclass(frozen=True, slots=True)
class ModelSpec:
    context_window: int
    max_output_tokens: int
    input_limit: int | None = None
    encoding: EncodingName = "o200k_base"
    known: bool = True


# (prefix, context window, max output[, input limit][, encoding])
_CATALOG: list[tuple[str, int, int, int | None, EncodingName]] = [
    # OpenAI
    ("gpt-5", 400_000, 128_000, 272_000, "o200k_base"),
    ("gpt-4.1", 1_047_576, 32_768, None, "o200k_base"),
    ("gpt-4o", 128_000, 16_384, None, "o200k_base"),
    ("chatgpt-4o", 128_000, 16_384, None, "o200k_base"),
    ("gpt-4.5", 128_000, 16_384, None, "o200k_base"),
    ("gpt-oss", 131_072, 32_768, None, "o200k_base"),
    ("o1-mini", 128_000, 65_536, None, "o200k_base"),
    ("o1", 200_000, 100_000, None, "o200k_base"),
    ("o3", 200_000, 100_000, None, "o200k_base"),
    ("o4-mini", 200_000, 100_000, None, "o200k_base"),
    ("codex-mini", 200_000, 100_000, None, "o200k_base"),
    ("gpt-4-turbo", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-1106", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-0125", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-32k", 32_768, 4_096, None, "cl100k_base"),
    ("gpt-4", 8_192, 4_096, None, "cl100k_base"),
    ("gpt-3.5-turbo-16k", 16_385, 4_096, None, "cl100k_base"),
    ("gpt-3.5-turbo", 16_385, 4_096, None, "cl100k_base"),
    # Anthropic
    ("claude-opus-4", 200_000, 32_000, None, "o200k_base"),
    ("claude-sonnet-4", 200_000, 64_000, None, "o200k_base"),
    ("claude-haiku-4", 200_000, 64_000, None, "o200k_base"),
    ("claude-3-7-sonnet", 200_000, 64_000, None, "o200k_base"),
    ("claude-3-5-sonnet", 200_000, 8_192, None, "o200k_base"),
    ("claude-3-5-haiku", 200_000, 8_192, None, "o200k_base"),
    ("claude-3-opus", 200_000, 4_096, None, "o200k_base"),
    ("claude-3-haiku", 200_000, 4_096, None, "o200k_base"),
    ("claude-haiku-3", 200_000, 4_096, None, "o200k_base"),
    ("claude", 200_000, 8_192, None, "o200k_base"),
    # Google
    ("gemini-2.5-pro", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini-2.5-flash", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini-2.0-flash", 1_048_576, 8_192, None, "o200k_base"),
    ("gemini-1.5-pro", 2_097_152, 8_192, None, "o200k_base"),
    ("gemini-1.5-flash", 1_048_576, 8_192, None, "o200k_base"),
    ("gemini-3", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini", 1_048_576, 8_192, None, "o200k_base"),
    ("gemma-3", 131_072, 8_192, None, "o200k_base"),
    ("gemma3", 131_072, 8_192, None, "o200k_base"),  # Ollama's spelling
    # DeepSeek
    ("deepseek-reasoner", 128_000, 64_000, None, "o200k_base"),
    ("deepseek-chat", 128_000, 8_192, None, "o200k_base"),
    ("deepseek-r1", 128_000, 32_768, None, "o200k_base"),
    ("deepseek-v3", 128_000, 8_192, None, "o200k_base"),
    ("deepseek-coder", 128_000, 8_192, None, "o200k_base"),
    ("deepseek", 128_000, 8_192, None, "o200k_base"),
    # Qwen
    ("qwen3-coder", 262_144, 65_536, None, "o200k_base"),
    ("qwen3", 131_072, 32_768, None, "o200k_base"),
    ("qwen2.5-coder", 131_072, 8_192, None, "o200k_base"),
    ("qwen2.5", 131_072, 8_192, None, "o200k_base"),
    ("qwen-max", 32_768, 8_192, None, "o200k_base"),
    ("qwen-plus", 131_072, 8_192, None, "o200k_base"),
    ("qwen-turbo", 1_000_000, 8_192, None, "o200k_base"),
    ("qwq", 131_072, 32_768, None, "o200k_base"),
    # Meta Llama
    ("llama-4-scout", 10_000_000, 16_384, None, "o200k_base"),
    ("llama-4-maverick", 1_048_576, 16_384, None, "o200k_base"),
    ("llama-3.3", 131_072, 8_192, None, "o200k_base"),
    ("llama-3.2", 131_072, 8_192, None, "o200k_base"),
    ("llama-3.1", 131_072, 8_192, None, "o200k_base"),
    ("llama3.3", 131_072, 8_192, None, "o200k_base"),
    ("llama3.2", 131_072, 8_192, None, "o200k_base"),
    ("llama3.1", 131_072, 8_192, None, "o200k_base"),
    ("llama3-3", 131_072, 8_192, None, "o200k_base"),  # Bedrock's spelling
    ("llama3-2", 131_072, 8_192, None, "o200k_base"),
    ("llama3-1", 131_072, 8_192, None, "o200k_base"),
    ("llama-3", 8_192, 4_096, None, "o200k_base"),
    ("llama3", 8_192, 4_096, None, "o200k_base"),
    # Mistral
    ("mistral-large", 131_072, 8_192, None, "o200k_base"),
    ("mistral-medium", 131_072, 8_192, None, "o200k_base"),
    ("mistral-small", 131_072, 8_192, None, "o200k_base"),
    ("codestral", 262_144, 8_192, None, "o200k_base"),
    ("devstral", 131_072, 8_192, None, "o200k_base"),
    ("magistral", 40_000, 40_000, None, "o200k_base"),
    ("ministral", 131_072, 8_192, None, "o200k_base"),
    ("mixtral-8x22b", 65_536, 8_192, None, "o200k_base"),
    ("mixtral", 32_768, 8_192, None, "o200k_base"),
    ("mistral-nemo", 131_072, 8_192, None, "o200k_base"),
    ("mistral", 32_768, 8_192, None, "o200k_base"),
    # Others commonly served through OpenAI-compatible endpoints
    ("grok-4", 256_000, 32_768, None, "o200k_base"),
    ("grok-3", 131_072, 16_384, None, "o200k_base"),
    ("kimi-k2", 131_072, 16_384, None, "o200k_base"),
    ("glm-4", 131_072, 16_384, None, "o200k_base"),
]
_CATALOG.sort(key=lambda row: len(row[0]), reverse=True)

_BEDROCK_VENDOR = re.compile(r"^(?:[a-z]{2,6}(?:-[a-z]+)?\.)?(?:anthropic|meta|mistral)\.")


def normalize(model: str) -> str:
    """Lower-case, drop provider prefixes (``a/b/model`` → ``model``) and Bedrock's vendor dot."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    # Bedrock: ``anthropic.claude-…``, or with a cross-region inference profile
    # (``us.``, ``eu.``, ``apac.``, ``us-gov.``, ``global.``…) in front.
    name = _BEDROCK_VENDOR.sub("", name, count=1)
    return (
        name.split(":", 1)[0]
        if name.startswith(("llama", "qwen", "mistral", "gemma", "deepseek"))
        else name
    )


@functools.lru_cache(maxsize=1024)
def lookup(model: str) -> ModelSpec:
    """The catalog entry for ``model``, or the 128k default for an unknown one.
    Remembered (a few times per request, a scan of the catalog each)."""
    name = normalize(model)
    for prefix, window, max_output, input_limit, encoding in _CATALOG:
        if name.startswith(prefix):
            return ModelSpec(window, max_output, input_limit, encoding)
    return ModelSpec(UNKNOWN_CONTEXT_WINDOW, UNKNOWN_MAX_OUTPUT, None, "o200k_base", known=False)
