"""A small coding agent on the Anthropic SDK that keeps its history in compactd, called
explicitly through compactd_client. Each step: append what is new, read the context
compactd builds (it fits the model's window however long the task runs), call the
model with it, report the usage the SDK returned, and append the reply.

    ANTHROPIC_API_KEY=sk-ant-... python examples/anthropic_explicit.py "What does this project do?"

The SDK calls the provider itself (ANTHROPIC_BASE_URL, else Anthropic's API); without
ANTHROPIC_API_KEY it calls the scripted demo model of examples/_upstream.py instead,
which it starts on a free port of 127.0.0.1. Settings:
ANTHROPIC_MODEL (default claude-sonnet-4-6), COMPACTD_URL (default
http://127.0.0.1:8080), COMPACTD_API_KEY (when compactd has keys), COMPACTD_SESSION
(default: a new one).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any, cast

from anthropic import Anthropic, omit
from anthropic.types import MessageParam, TextBlockParam, ToolParam
from compactd_client import Compactd, CompactdConnectionError, ProblemError

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-6")
COMPACTD_URL = os.environ.get("COMPACTD_URL", "http://127.0.0.1:8080").rstrip("/")
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
    if os.environ.get("ANTHROPIC_API_KEY"):
        llm = Anthropic()  # ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL
    else:  # no key: the scripted demo model, on a free port
        from _upstream import start

        _, demo = start()
        print(f"[no ANTHROPIC_API_KEY: the scripted demo model at {demo}]", file=sys.stderr)
        llm = Anthropic(api_key="demo", base_url=demo)
    with Compactd(COMPACTD_URL) as compactd:  # and COMPACTD_API_KEY
        session_id = (
            os.environ.get("COMPACTD_SESSION") or f"anthropic-explicit-{uuid.uuid4().hex[:8]}"
        )
        compactd.create_session(MODEL, id=session_id)
        print(f"[compactd session {session_id}]", file=sys.stderr)
        # The system prompt and the tools go with the first append, as in the request.
        compactd.append_messages(
            session_id,
            [{"role": "user", "content": task}],
            format="anthropic",
            system=SYSTEM,
            tools=TOOLS,
        )
        for _ in range(MAX_STEPS):
            context = compactd.get_context(session_id, format="anthropic")
            response = llm.messages.create(
                model=MODEL,
                max_tokens=MAX_TOKENS,
                system=cast(list[TextBlockParam], context["system"]) if context["system"] else omit,
                messages=cast(list[MessageParam], context["messages"]),
                tools=TOOLS,
            )
            compactd.report_usage(
                session_id,
                response.usage,
                finish_reason=response.stop_reason,
                context_version=context["version"],
            )
            reply = {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in response.content],
            }
            results = []
            for block in response.content:
                if block.type == "tool_use":
                    print(f"> {block.name}({block.input})", file=sys.stderr)
                    output = run_tool(block.name, block.input)
                    results.append(
                        {"type": "tool_result", "tool_use_id": block.id, "content": output}
                    )
            new = [reply, {"role": "user", "content": results}] if results else [reply]
            compactd.append_messages(session_id, new, format="anthropic")
            if not results:
                print("".join(block.text for block in response.content if block.type == "text"))
                return
    sys.exit(f"no answer after {MAX_STEPS} steps")


def _main() -> None:
    """``main``, with compactd's refusals and absence said in one line, not a traceback."""
    try:
        main()
    except ProblemError as exc:
        if exc.status != 401:
            raise
        sys.exit(
            f"compactd at {COMPACTD_URL} refused the request (401: {exc.detail}): set "
            "COMPACTD_API_KEY to a key (`compactd keys create --tenant default`), or delete "
            "the keys to go back to open mode (docs/security.md)"
        )
    except CompactdConnectionError as exc:
        sys.exit(f"cannot reach compactd at {COMPACTD_URL} ({exc}): is it running (`make run`)?")


if __name__ == "__main__":
    _main()
