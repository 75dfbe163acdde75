"""A small coding agent on the OpenAI Agents SDK whose session is compactd: the one
change to an Agents SDK program is ``session=CompactdSession(...)`` in ``Runner.run``
(and a usage report after it). Each run starts from the context compactd manages, so a
conversation continued run after run (the same COMPACTD_SESSION) stays within the
model's window; the history keeps every item.

    OPENAI_API_KEY=sk-... python examples/openai_agents_session.py "What does this project do?"

With OPENAI_API_KEY the SDK calls OpenAI's Responses API (OPENAI_BASE_URL, else
OpenAI's). Without it, it calls the scripted demo model of examples/_upstream.py through
the SDK's chat-completions model, starting it on a free port of 127.0.0.1, with tracing
off. Settings: OPENAI_MODEL (default gpt-4.1-mini), COMPACTD_URL (default
http://127.0.0.1:8080), COMPACTD_API_KEY (when compactd has keys), COMPACTD_SESSION
(default: a new one).

Needs ``pip install './clients/python[agents]'`` (the dev venv has it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from compactd_client import AsyncCompactd, CompactdConnectionError, ProblemError
from compactd_client.openai_agents import CompactdSession
from openai import AsyncOpenAI

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")
COMPACTD_URL = os.environ.get("COMPACTD_URL", "http://127.0.0.1:8080").rstrip("/")
MAX_TURNS = 20
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


@function_tool
def list_files(path: str = ".") -> str:
    """List a folder of the project, one name a line (folders end in /).

    Args:
        path: A folder.
    """
    print(f"> list_files({json.dumps({'path': path})})", file=sys.stderr)
    entries = sorted(inside(path).iterdir())
    return "\n".join(p.name + "/" * p.is_dir() for p in entries if not p.name.startswith("."))


@function_tool
def read_file(path: str) -> str:
    """Read a text file of the project.

    Args:
        path: A file.
    """
    print(f"> read_file({json.dumps({'path': path})})", file=sys.stderr)
    return inside(path).read_text(encoding="utf-8", errors="replace")[:20_000]


def model() -> str | Model:
    if os.environ.get("OPENAI_API_KEY"):
        return MODEL  # the SDK's default: the Responses API, OPENAI_API_KEY, OPENAI_BASE_URL
    from _upstream import start  # no key: the scripted demo model, on a free port

    _, demo = start()
    print(f"[no OPENAI_API_KEY: the scripted demo model at {demo}]", file=sys.stderr)
    set_tracing_disabled(True)  # traces go to OpenAI, with a key
    client = AsyncOpenAI(api_key="demo", base_url=f"{demo}/v1")
    return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)


async def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} TASK")
    task = " ".join(sys.argv[1:])
    agent = Agent(name="coder", instructions=SYSTEM, tools=[list_files, read_file], model=model())
    session_id = os.environ.get("COMPACTD_SESSION") or f"agents-{uuid.uuid4().hex[:8]}"
    async with AsyncCompactd(COMPACTD_URL) as compactd:  # and COMPACTD_API_KEY
        session = CompactdSession(session_id, model=MODEL, client=compactd)
        print(f"[compactd session {await session.compactd_session_id()}]", file=sys.stderr)
        result = await Runner.run(agent, task, session=session, max_turns=MAX_TURNS)
        report = await session.report_usage(result)  # the provider's figures, for compactd
        if report is not None:
            verdict = report["overflow"]
            print(
                f"[compactd: {verdict['estimated_tokens']} of {verdict['usable_tokens']} "
                f"tokens in use; next: {verdict['action']}]",
                file=sys.stderr,
            )
    print(result.final_output)


def _main() -> None:
    """``main``, with compactd's refusals and absence said in one line, not a traceback."""
    try:
        asyncio.run(main())
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
