"""The example agent loops (examples/) run as a user runs them (examples/README.md,
"Without a key"): each is a subprocess, with no provider key in its environment,
against a live compactd (uvicorn) named by COMPACTD_URL. The explicit examples start
their own scripted demo model (examples/_upstream.py, on a free port); the proxy
examples reach the one compactd's proxy is pointed at, started as a user starts it
(``python examples/_upstream.py --port N``). Each must finish its task (exit 0, the demo
model's answer printed) and leave the conversation stored in compactd: the task, the
tool call, the tool's real output paired with it, the answer. With API keys on, each
says so in one line (no traceback), and runs with COMPACTD_API_KEY.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from compactd_client import Compactd

from app.core.settings import Settings
from app.keys import repository
from app.main import create_app
from tests import postgres
from tests.e2e.server import free_port, running

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TASK = "What is in this project?"
SYSTEM_START = "You are a coding agent working in the current directory."
# What the demo model answers once a tool's result is back (examples/_upstream.py).
DEMO_DONE = "the task is done"
ALL = ["openai_proxy.py", "anthropic_proxy.py", "openai_explicit.py", "anthropic_explicit.py"]


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """The examples' scripted demo model, in a process of its own; its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "_upstream.py"), "--port", str(port)],
        cwd="/",  # it needs nothing of the repository but its own file
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    _, err = process.communicate(timeout=5)
                    raise RuntimeError(f"the demo provider did not start: {err.decode()}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


@pytest.fixture
def compactd_url(db_url: str, settings: Settings, provider: str) -> Iterator[str]:
    """compactd, its proxy sending the calls on to the demo provider."""
    update = {"proxy_openai_url": f"{provider}/v1", "proxy_anthropic_url": provider}
    with running(create_app(settings.model_copy(update=update), database_url=db_url)) as base:
        yield base


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The folder the agent works in (its tools list and read it)."""
    (tmp_path / "README.md").write_text("# A tiny project\n", encoding="utf-8")
    (tmp_path / "app.py").write_text("print('hello')\n", encoding="utf-8")
    (tmp_path / "src").mkdir()
    return tmp_path


def example_env(**extra: str) -> dict[str, str]:
    """The user's environment without any provider or compactd setting, plus ``extra``;
    the tests' own package is not on the path (the examples must not need it)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPACTD_", "OPENAI_", "ANTHROPIC_")) and k != "PYTHONPATH"
    }
    return env | extra


def run_example(name: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), TASK],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(f"\n[{name}] exit {result.returncode} in {time.monotonic() - started:.2f} s")
    print(result.stderr)
    return result


@pytest.mark.parametrize("name", ALL)
def test_the_example_finishes_its_task_and_compactd_holds_the_conversation(
    name: str, compactd_url: str, project: Path
) -> None:
    session_id = f"example-{name.removesuffix('.py').replace('_', '-')}"
    env = example_env(COMPACTD_URL=compactd_url, COMPACTD_SESSION=session_id)
    result = run_example(name, project, env)
    assert result.returncode == 0, result.stderr
    assert DEMO_DONE in result.stdout
    assert f"[compactd session {session_id}]" in result.stderr
    if "explicit" in name:  # its own demo model, on a free port of loopback
        assert "the scripted demo model at http://127.0.0.1:" in result.stderr
    assert "> list_files(" in result.stderr

    with Compactd(compactd_url) as compactd:
        stored = [e["message"] for e in compactd.list_messages(session_id, limit=1000)["entries"]]
        session = compactd.get_session(session_id)
    if "explicit" in name:  # it appended the system prompt itself (the proxy: its rule)
        assert stored[0]["role"] == "system"
        assert SYSTEM_START in json.dumps(stored[0]["content"])
    task, call, output, answer = [m for m in stored if m["role"] != "system"]
    assert task == {"role": "user", "content": TASK}
    assert call["role"] == "assistant"
    [tool_call] = call["tool_calls"]
    assert tool_call["function"]["name"] == "list_files"
    assert output["role"] == "tool"
    assert output["tool_call_id"] == tool_call["id"]
    assert text_of(output) == "README.md\napp.py\nsrc/"  # the tool ran, in the project
    assert answer["role"] == "assistant"
    assert DEMO_DONE in text_of(answer)
    # The provider's usage was reported (by the proxy, or by the explicit loop).
    assert session["usage_count"] == 2
    assert session["last_usage"] is not None


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


async def _create_key(db_url: str) -> str:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        return (await repository.create(conn, "default", "examples"))[1]
    finally:
        await conn.close()


@pytest.fixture
async def api_key(db_url: str) -> str:
    """compactd has a key (as after docs/security.md's `keys create`)."""
    return await _create_key(db_url)


@pytest.mark.slow  # eight runs of the examples, each a Python start with its SDK
@pytest.mark.parametrize("name", ALL)
def test_with_keys_on_the_example_says_so_in_one_line_then_runs_with_its_key(
    name: str, api_key: str, compactd_url: str, project: Path
) -> None:
    """Before: a traceback (compactd_client.ProblemError, openai.AuthenticationError).
    With COMPACTD_API_KEY the example runs: sent by compactd_client (explicit) or as
    X-Compactd-Key (proxy)."""
    refused = run_example(name, project, example_env(COMPACTD_URL=compactd_url))
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    for needed in ("401", "COMPACTD_API_KEY", "docs/security.md"):
        assert needed in last, last
    assert compactd_url in last

    keyed = example_env(COMPACTD_URL=compactd_url, COMPACTD_API_KEY=api_key)
    result = run_example(name, project, keyed)
    assert result.returncode == 0, result.stderr
    assert DEMO_DONE in result.stdout


@pytest.mark.slow  # the SDKs retry a refused connection, with backoff, before they give up
@pytest.mark.parametrize("name", ["openai_proxy.py", "openai_explicit.py"])
def test_without_compactd_the_example_says_so_in_one_line(name: str, project: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    result = run_example(name, project, example_env(COMPACTD_URL=nobody))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"cannot reach compactd at {nobody}" in result.stderr.strip().splitlines()[-1]


# The session-store adapters' examples (compactd_client.openai_agents and .langchain):
# their frameworks call the demo model themselves; compactd holds the conversation.
ADAPTERS = ["openai_agents_session.py", "langchain_history.py"]


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_adapter_example_finishes_its_task_and_compactd_holds_the_conversation(
    name: str, compactd_url: str, project: Path
) -> None:
    session_id = f"example-{name.removesuffix('.py').replace('_', '-')}"
    env = example_env(COMPACTD_URL=compactd_url, COMPACTD_SESSION=session_id)
    result = run_example(name, project, env)
    assert result.returncode == 0, result.stderr
    assert DEMO_DONE in result.stdout
    assert f"[compactd session {session_id}]" in result.stderr
    assert "the scripted demo model at http://127.0.0.1:" in result.stderr
    assert "> list_files(" in result.stderr

    with Compactd(compactd_url) as compactd:
        stored = [e["message"] for e in compactd.list_messages(session_id, limit=1000)["entries"]]
        session = compactd.get_session(session_id)
    if name == "langchain_history.py":  # the app adds its system prompt to the history
        system = stored.pop(0)
        assert system["role"] == "system"
        assert SYSTEM_START in json.dumps(system["content"])
    # (The Agents SDK sends its instructions with each call; the session holds the items.)
    task, call, output, answer = stored
    assert task["role"] == "user"
    assert text_of(task) == TASK
    assert call["role"] == "assistant"
    [tool_call] = call["tool_calls"]
    assert tool_call["function"]["name"] == "list_files"
    assert output["role"] == "tool"
    assert output["tool_call_id"] == tool_call["id"]
    assert text_of(output) == "README.md\napp.py\nsrc/"  # the tool ran, in the project
    assert answer["role"] == "assistant"
    assert DEMO_DONE in text_of(answer)
    # The usage was reported: the run's first call (Agents SDK), every reply (LangChain).
    assert session["usage_count"] == (1 if name == "openai_agents_session.py" else 2)
    assert session["last_usage"] is not None


@pytest.mark.slow  # four runs of the examples, each a Python start with its framework
@pytest.mark.parametrize("name", ADAPTERS)
def test_with_keys_on_the_adapter_example_says_so_in_one_line_then_runs_with_its_key(
    name: str, api_key: str, compactd_url: str, project: Path
) -> None:
    test_with_keys_on_the_example_says_so_in_one_line_then_runs_with_its_key(
        name, api_key, compactd_url, project
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTERS)
def test_without_compactd_the_adapter_example_says_so_in_one_line(name: str, project: Path) -> None:
    test_without_compactd_the_example_says_so_in_one_line(name, project)
