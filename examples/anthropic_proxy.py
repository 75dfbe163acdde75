"""A small coding agent on the Anthropic SDK whose history compactd keeps through its
proxy. It is a plain Anthropic agent loop: the only change is the SDK's base URL
(compactd's proxy) and one header naming the session. compactd stores what the agent
sends and receives, and sends the provider a context that fits the model's window.

    ANTHROPIC_API_KEY=sk-ant-... python examples/anthropic_proxy.py "What does this project do?"

The key passes through compactd to the provider compactd is configured with
(COMPACTD_PROXY_ANTHROPIC_URL, default Anthropic's API). Settings: ANTHROPIC_MODEL (default
claude-sonnet-4-6), COMPACTD_URL (default http://127.0.0.1:8080), COMPACTD_SESSION (default:
a new one), COMPACTD_API_KEY (when compactd has keys: sent as X-Compactd-Key).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anthropic
from anthropic import Anthropic
from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam

COMPACTD_URL = os.environ.get("COMPACTD_URL", "http://127.0.0.1:8080").rstrip("/")
MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-6")
MAX_STEPS = 20
MAX_TOKENS = 4096
ROOT = Path.cwd().resolve()
SYSTEM = (
    "You are a coding agent working in the current directory. Use list_files and "
    "read_file to look at the code before you answer, then answer briefly."
)


def inside(path: str) -> Path:
    """``path`` under the working directory, or an error."""
    target = (ROOT / path).resolve()
    if not target.is_relative_to(ROOT):
        raise ValueError(f"{path} is outside {ROOT}")
    return target


def list_files(path: str = ".") -> str:
    entries = sorted(inside(path).iterdir())
    return "\n".join(p.name + "/" * p.is_dir() for p in entries if not p.name.startswith("."))


def read_file(path: str) -> str:
    return inside(path).read_text(encoding="utf-8", errors="replace")[:20_000]


def run_tool(name: str, args: Any) -> str:
    """The tool's output, or the error the model should see."""
    try:
        if name == "list_files":
            return list_files(**args)
        if name == "read_file":
            return read_file(**args)
        return f"error: no tool named {name}"
    except (OSError, ValueError, TypeError) as exc:
        return f"error: {exc}"


TOOLS: list[ToolParam] = [
    {
        "name": "list_files",
        "description": "List a folder of the project, one name a line (folders end in /).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "default": ".", "description": "A folder."}},
        },
    },
    {
        "name": "read_file",
        "description": "Read a text file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "A file."}},
            "required": ["path"],
        },
    },
]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} TASK")
    task = " ".join(sys.argv[1:])
    session_id = os.environ.get("COMPACTD_SESSION") or f"anthropic-proxy-{uuid.uuid4().hex[:8]}"
    print(f"[compactd session {session_id}]", file=sys.stderr)
    headers = {"X-Compactd-Session": session_id}
    if os.environ.get("COMPACTD_API_KEY"):  # a compactd with keys wants one
        headers["X-Compactd-Key"] = os.environ["COMPACTD_API_KEY"]
    llm = Anthropic(
        # Without a key of its own, any will do for the scripted demo model
        # (examples/_upstream.py) compactd may be pointed at.
        api_key=os.environ.get("ANTHROPIC_API_KEY") or "demo",
        base_url=f"{COMPACTD_URL}/proxy/anthropic",
        default_headers=headers,
    )
    messages: list[MessageParam] = [{"role": "user", "content": task}]
    for _ in range(MAX_STEPS):
        response = llm.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=messages, tools=TOOLS
        )
        messages.append({"role": "assistant", "content": response.content})
        results: list[ToolResultBlockParam] = []
        for block in response.content:
            if block.type == "tool_use":
                print(f"> {block.name}({block.input})", file=sys.stderr)
                output = run_tool(block.name, block.input)
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": output})
        if not results:
            print("".join(block.text for block in response.content if block.type == "text"))
            return
        messages.append({"role": "user", "content": results})
    sys.exit(f"no answer after {MAX_STEPS} steps")


def _main() -> None:
    """``main``, with compactd's refusals and absence said in one line, not a traceback."""
    try:
        main()
    except anthropic.AuthenticationError as exc:
        sys.exit(
            f"401 through compactd's proxy at {COMPACTD_URL}: {exc.message}. If compactd has "
            "keys, set COMPACTD_API_KEY to one (or delete them to go back to open mode: "
            "docs/security.md); else the provider refused the key (without one, point "
            "compactd at examples/_upstream.py: examples/README.md)"
        )
    except anthropic.APIConnectionError:
        sys.exit(f"cannot reach compactd at {COMPACTD_URL}: is it running (`make run`)?")


if __name__ == "__main__":
    _main()
