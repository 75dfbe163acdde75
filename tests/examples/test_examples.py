"""The example agent loops (examples/) run as a user runs them (examples/README.md,
"Without a key"): each is a subprocess, against a live compactd (uvicorn, its proxy
pointed at the scripted provider) and the scripted provider in its demo mode, itself
started as ``python -m tests.upstream_server --port N``. Each must finish its task
(exit 0, the demo model's answer printed) and leave the conversation stored in
compactd: the task, the tool call, the tool's real output paired with it, the answer.
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

import pytest
from compactd_client import Compactd

from app.core.settings import Settings
from app.main import create_app
from tests.e2e.server import free_port, running

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TASK = "What is in this project?"
SYSTEM_START = "You are a coding agent working in the current directory."
# What the demo model answers once a tool's result is back (tests/upstream_server.py).
DEMO_DONE = "the task is done"


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """The scripted provider in demo mode, in a process of its own; its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.upstream_server", "--port", str(port)],
        cwd=ROOT,
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


@pytest.mark.parametrize(
    "name", ["openai_proxy.py", "anthropic_proxy.py", "openai_explicit.py", "anthropic_explicit.py"]
)
def test_the_example_finishes_its_task_and_compactd_holds_the_conversation(
    name: str, compactd_url: str, provider: str, project: Path
) -> None:
    session_id = f"example-{name.removesuffix('.py').replace('_', '-')}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPACTD_", "OPENAI_", "ANTHROPIC_"))
    }
    env |= {
        "COMPACTD_URL": compactd_url,
        "COMPACTD_SESSION": session_id,
        "OPENAI_API_KEY": "demo",
        "OPENAI_BASE_URL": f"{provider}/v1",
        "ANTHROPIC_API_KEY": "demo",
        "ANTHROPIC_BASE_URL": provider,
    }
    result = run_example(name, project, env)
    assert result.returncode == 0, result.stderr
    assert DEMO_DONE in result.stdout
    assert f"[compactd session {session_id}]" in result.stderr
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
