"""The usage object ``report_usage`` takes, in the shapes SDKs and users hand it: a
dict, a Mapping that is no dict, something dict-like that is no Mapping, a dataclass
and a plain object with attributes (nested details included). Before, anything but a
Mapping or a pydantic object raised ``AttributeError: ... 'model_dump'``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
from compactd_client import Compactd

SYSTEM_AND_TASK = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Why does test_login fail?"},
]


class DictLike:
    """keys() and [] but no Mapping: as some SDKs' usage objects are."""

    def __init__(self, **fields: Any) -> None:
        self._fields = fields

    def keys(self) -> Iterator[str]:
        return iter(self._fields)

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]


@dataclass
class Details:
    cached_tokens: int


@dataclass
class DataclassUsage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Details


def _openai_shapes(prompt: int) -> list[object]:
    fields = {"prompt_tokens": prompt, "completion_tokens": 9, "total_tokens": prompt + 9}
    return [
        fields,
        MappingProxyType(fields),
        DictLike(**fields),
        SimpleNamespace(**fields, prompt_tokens_details=SimpleNamespace(cached_tokens=prompt)),
        DataclassUsage(prompt, 9, prompt + 9, Details(cached_tokens=prompt)),
    ]


def test_every_usage_shape_is_reported_as_its_fields(compactd_url: str) -> None:
    with Compactd(compactd_url) as compactd:
        session = compactd.create_session("gpt-4o", id="usage-shapes")
        compactd.append_messages(session["id"], SYSTEM_AND_TASK)
        prompt = compactd.get_context(session["id"])["tokens"]["estimated"] + 5
        for shape in _openai_shapes(prompt):
            result = compactd.report_usage(session["id"], shape, finish_reason="stop")
            assert result["usage_format"] == "openai_chat", type(shape).__name__
            assert result["reported_prompt_tokens"] == prompt, type(shape).__name__
        assert compactd.get_session(session["id"])["usage_count"] == len(_openai_shapes(0))


def test_a_usage_that_has_no_fields_is_a_clear_type_error(compactd_url: str) -> None:
    with Compactd(compactd_url) as compactd:
        compactd.create_session("gpt-4o", id="usage-shapes-bad")
        with pytest.raises(TypeError, match="usage must be a mapping or an object with fields"):
            compactd.report_usage("usage-shapes-bad", 42)
