"""The real agents connect to compactd's MCP server (``/mcp``) configured exactly as
docs/mcp.md says, and Claude Code recalls its own compacted past with it.

Each agent is set up from the page's own text (the ``claude mcp add`` command run by a
shell, Codex's TOML, OpenCode's JSON), its address and session swapped for the test's,
against a real compactd with API keys; its own MCP command then reports what it read or
whether it connected. Then Claude Code runs the tier's long task (tests/agents/script.py)
in a window it outgrows, through the proxy; once compactd has compacted the early steps
away, the scripted model calls ``mcp__compactd__history_search`` for the first step's
output, and Claude Code's next request carries the hit, marked compacted.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.recall import agent_tools
from tests.agents import agents, script
from tests.agents.conftest import require
from tests.agents.install import CLAUDE, CODEX, OPENCODE
from tests.ops.conftest import bearer, create_key
from tests.proxy.support import proxy
from tests.upstream_server import Action, RecordedRequest, Reply, ToolCalls, Upstream

pytestmark = [pytest.mark.slow, pytest.mark.agents]

DOC = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text(encoding="utf-8")
DOC_BASE = "http://127.0.0.1:8080"
DOC_SESSION = "my-project"
SEARCH = "mcp__compactd__history_search"
TOOL_SEARCH = "ToolSearch"


def block(language: str, containing: str) -> str:
    """The page's ``language`` code block that holds ``containing``."""
    for found in re.finditer(rf"```{language}\n(.*?)```", DOC, re.S):
        if containing in found.group(1):
            return found.group(1)
    raise AssertionError(f"docs/mcp.md has no {language} block with {containing!r}")


def as_tested(text: str, base: str, session: str) -> str:
    assert DOC_BASE in text, text
    return text.replace(DOC_BASE, base).replace(DOC_SESSION, session)


def command(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=90, check=False
    )


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def add_claude_server(
    base: str, session: str, key: str, env: dict[str, str], work: Path
) -> subprocess.CompletedProcess[str]:
    """docs/mcp.md's ``claude mcp add`` command, run by a shell as a user runs it, with
    the claude binary of the tier first on the PATH."""
    script_text = as_tested(block("sh", "claude mcp add"), base, session)
    path = f"{CLAUDE.executable.parent}:{env['PATH']}"
    return command(
        ["bash", "-c", script_text], {**env, "PATH": path, "COMPACTD_API_KEY": key}, work
    )


async def test_each_agent_reads_the_documented_configuration(
    db_url: str, settings: Settings, upstream: Upstream, dead_port: int, folders: tuple[Path, Path]
) -> None:
    """Claude Code and OpenCode connect to ``/mcp`` with a key (their own ``mcp list``
    says so); Codex reads its documented table as a Streamable HTTP server with the
    key's variable and the session header."""
    home, work = folders
    key = await create_key(db_url, "agents")
    with proxy(settings, db_url, upstream) as base:
        env = agents.offline_env(home, dead_port)
        require("claude")
        claude_env = agents.prepare_claude(f"{base}/proxy/anthropic", "mcp-docs", "", env).env
        added = add_claude_server(base, "mcp-docs", key, claude_env, work)
        assert added.returncode == 0, added.stderr
        listed = command([str(CLAUDE.executable), "mcp", "list"], claude_env, work)
        assert f"compactd: {base}/mcp (HTTP) - ✔ Connected" in listed.stdout, listed

        require("opencode")
        config = json.loads(as_tested(block("json", '"mcp"'), base, "mcp-docs"))
        (home / "opencode.json").write_text(json.dumps(config))
        opencode_env = {
            **env,
            "OPENCODE_CONFIG": str(home / "opencode.json"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "COMPACTD_API_KEY": key,
        }
        listed = command([str(OPENCODE.executable), "mcp", "list"], opencode_env, work)
        assert re.search(r"✓\s+compactd\s.*connected", listed.stdout + listed.stderr), listed

        require("codex")
        codex_home = home / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(as_tested(block("toml", "[mcp_servers"), base, "x"))
        codex_env = {**env, "CODEX_HOME": str(codex_home)}
        got = command([str(CODEX.executable), "mcp", "get", "compactd", "--json"], codex_env, work)
        assert got.returncode == 0, got
        transport = json.loads(got.stdout)["transport"]
        documented = tomllib.loads(block("toml", "[mcp_servers"))["mcp_servers"]["compactd"]
        assert transport["type"] == "streamable_http", transport
        assert transport["url"] == f"{base}/mcp"
        assert transport["bearer_token_env_var"] == documented["bearer_token_env_var"]
        assert transport["env_http_headers"] == {"X-Compactd-Session": "COMPACTD_SESSION"}


async def test_codex_offers_the_tools_from_the_documented_table(
    db_url: str, settings: Settings, upstream: Upstream, dead_port: int, folders: tuple[Path, Path]
) -> None:
    """``codex exec`` with docs/mcp.md's table (and the tier's provider, its calls
    carrying compactd's key too) connects to ``/mcp`` with the key from
    ``COMPACTD_API_KEY`` and offers the model the two tools, as ``/v1/tools`` defines
    them, in its ``mcp__compactd`` namespace."""
    require("codex")
    home, work = folders
    key = await create_key(db_url, "agents")
    upstream.respond = lambda api, body: Reply("DONE")
    with proxy(settings, db_url, upstream) as base:
        prepared = agents.prepare_codex(
            f"{base}/proxy/openai/v1", "mcp-codex", "hello", agents.offline_env(home, dead_port)
        )
        config = Path(prepared.env["CODEX_HOME"]) / "config.toml"
        provider = config.read_text().replace(
            '{ "X-Compactd-Session" = "COMPACTD_SESSION" }',
            '{ "X-Compactd-Session" = "COMPACTD_SESSION", "X-Compactd-Key" = "COMPACTD_API_KEY" }',
        )
        table = as_tested(block("toml", "[mcp_servers"), base, "mcp-codex")
        config.write_text(f"{provider}\n{table}")
        prepared.env["COMPACTD_API_KEY"] = key
        run = await asyncio.to_thread(agents.execute, prepared, work, 120)
    assert run.returncode == 0, run.describe()
    [request] = [r for r in upstream.requests if isinstance(r.json, dict) and r.json.get("tools")]
    namespaces = {t.get("name"): t for t in request.json["tools"] if t.get("type") == "namespace"}
    assert "mcp__compactd" in namespaces, sorted(namespaces)
    offered = {t["name"]: t for t in namespaces["mcp__compactd"]["tools"]}
    assert sorted(offered) == sorted(agent_tools.NAMES)
    for definition in agent_tools.definitions("openai"):
        function = definition["function"]
        assert offered[function["name"]]["description"] == function["description"]
        # Codex keeps each argument's type and description (it drops minimum and maximum).
        theirs = offered[function["name"]]["parameters"]["properties"]
        ours = function["parameters"]["properties"]
        assert {k: (v["type"], v["description"]) for k, v in theirs.items()} == {
            k: (v["type"], v["description"]) for k, v in ours.items()
        }


# The tier's long task (tests/agents/test_agents.py): 14 steps of some 1,000 tokens of
# output each, in a window of 24,000 where the agent's prompt and tools take 7,000 to
# 11,000, so compactd compacts the early steps away.
LONG = script.Task("recall", 14, filler=400)
WINDOW = {"context_window": 24_000, "max_output_tokens": 2_000}
LONG_CONFIG = {
    "compaction": {"reserve_tokens": 4_000, "keep_recent_tokens": 3_000},
    "prune": {"enabled": False},
}
FOOTER = "Read an entry whole with history_read"


def results(api: str, body: dict[str, Any]) -> list[str]:
    return [text for kind, text in script.conversation(api, body) if kind == "result"]


def asked(body: dict[str, Any], name: str) -> bool:
    """Whether the model has called tool ``name`` in the request's conversation."""
    return any(
        isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == name
        for message in body.get("messages") or []
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for block in message["content"]
    )


def respond(api: str, body: dict[str, Any]) -> Action:
    """The tier's script, except that once the task's steps are done the model first
    asks compactd's MCP tool for the first step's output, and answers after the hit.
    Claude Code defers MCP tools behind its ``ToolSearch`` (only their names are in
    the prompt): the model loads the tool's definition with it first, as a model does."""
    action = script.respond(api, body)
    if getattr(action, "text", None) != LONG.final():
        return action
    if any(FOOTER in text for text in results(api, body)):
        return action  # the hit came back: the answer
    tools = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
    if SEARCH in tools or asked(body, TOOL_SEARCH):
        return ToolCalls(((SEARCH, {"query": LONG.marker(1)}),))
    if TOOL_SEARCH in tools:
        return ToolCalls(((TOOL_SEARCH, {"query": f"select:{SEARCH}"}),))
    return action


async def test_claude_code_recalls_its_compacted_past_over_mcp(
    db_url: str, settings: Settings, upstream: Upstream, dead_port: int, folders: tuple[Path, Path]
) -> None:
    require("claude")
    home, work = folders
    key = await create_key(db_url, "agents")
    sid = "agent-claude-mcp"
    upstream.respond = respond
    with proxy(settings, db_url, upstream, compaction_workers=1) as base:
        async with httpx.AsyncClient(base_url=base, headers=bearer(key), timeout=60) as http:
            r = await http.post(
                "/v1/sessions",
                json={"id": sid, "model": "claude-sonnet-4-5", **WINDOW, "config": LONG_CONFIG},
            )
            assert r.status_code == 201, r.text
        prepared = agents.prepare_claude(
            f"{base}/proxy/anthropic", sid, LONG.prompt(), agents.offline_env(home, dead_port)
        )
        # The model calls carry compactd's key too (the service has keys).
        prepared.env["ANTHROPIC_CUSTOM_HEADERS"] = (
            f"{agents.SESSION_HEADER}: {sid}\nX-Compactd-Key: {key}"
        )
        added = add_claude_server(base, sid, key, prepared.env, work)
        assert added.returncode == 0, added.stderr
        run = await asyncio.to_thread(agents.execute, prepared, work, 180)
        async with httpx.AsyncClient(base_url=base, headers=bearer(key), timeout=60) as http:
            session = (await http.get(f"/v1/sessions/{sid}")).json()
    assert run.returncode == 0, run.describe()
    assert LONG.final() in run.stdout, run.describe()
    assert session["compaction_count"] >= 1, session

    main = [r for r in upstream.requests if isinstance(r.json, dict) and r.json.get("tools")]
    searched = [i for i, r in enumerate(main) if _calls_search(r)]
    assert len(searched) == 1, [sorted(t.get("name", "") for t in r.json["tools"]) for r in main]
    before, after = main[searched[0]], main[searched[0] + 1]
    # The MCP server's tool reached the model as /v1/tools defines it.
    offered = {t["name"]: t for t in before.json["tools"]}
    definition = agent_tools.definitions("anthropic")[0]
    assert offered[SEARCH]["description"] == definition["description"]
    assert offered[SEARCH]["input_schema"]["properties"] == definition["input_schema"]["properties"]
    # Step 1's output had been compacted out of what the model is sent...
    first = LONG.marker(1)
    assert not any(first in text for text in results("anthropic", before.json)), "not compacted"
    # ...and the search found it: the hit, marked compacted, in Claude Code's next request.
    hit = [text for text in results("anthropic", after.json) if FOOTER in text]
    assert len(hit) == 1, results("anthropic", after.json)
    blocks = hit[0].split("\n[seq ")
    assert any(
        re.match(r"\[?(seq )?\d+ · tool \(Bash\) · compacted\] ", b) and first in b for b in blocks
    ), hit[0]
    print(f"claude over MCP: {len(main)} calls, {session['compaction_count']} compactions")


def _calls_search(request: RecordedRequest) -> bool:
    """Whether the model's answer to ``request`` was the search (its next request then
    holds the call)."""
    body = request.json
    assert isinstance(body, dict)
    return respond("anthropic", body) == ToolCalls(((SEARCH, {"query": LONG.marker(1)}),))
