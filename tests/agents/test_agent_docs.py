"""docs/agents.md's settings are the ones the agent tier runs with (no agent needed)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from tests.agents import agents

DOC = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text(encoding="utf-8")


def _block(language: str) -> str:
    found = re.search(rf"```{language}\n(.*?)```", DOC, re.S)
    assert found, f"docs/agents.md has no {language} block"
    return found.group(1)


def test_the_codex_provider_is_the_tiers() -> None:
    documented = tomllib.loads(_block("toml"))
    tested = tomllib.loads(agents.codex_config("http://127.0.0.1:8080/proxy/openai/v1"))
    mine, theirs = documented["model_providers"]["compactd"], tested["model_providers"]["compactd"]
    for key in ("base_url", "wire_api", "env_http_headers"):
        assert mine[key] == theirs[key], key
    assert documented["model_provider"] == tested["model_provider"]


def test_the_opencode_provider_is_the_tiers() -> None:
    documented = json.loads(_block("json"))["provider"]["compactd"]
    tested = agents.opencode_config("http://127.0.0.1:8080/proxy/openai/v1", "my-project")
    provider = tested["provider"]
    assert isinstance(provider, dict)
    theirs = provider["compactd"]
    assert documented["npm"] == theirs["npm"]
    assert documented["options"]["baseURL"] == theirs["options"]["baseURL"]
    assert documented["options"]["headers"] == theirs["options"]["headers"]


def test_claude_codes_variables_are_the_tiers() -> None:
    env = agents.prepare_claude(
        "http://127.0.0.1:8080/proxy/anthropic", "my-project", "task", {}
    ).env
    for name in ("ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS"):
        assert f"export {name}={env[name]}" in DOC or f'export {name}="{env[name]}"' in DOC, name
