"""A small coding agent whose LangChain chat history is compactd: the loop reads
``history.messages`` (the context compactd manages: it fits the model's window however
long the task runs), calls the model with them, and adds the reply and the tools'
results with ``history.add_message``. The reply's ``usage_metadata`` is reported to
compactd by the history itself.

    OPENAI_API_KEY=sk-... python examples/langchain_history.py "What does this project do?"

The tools are LangChain tools (``langchain_core.tools.tool``); the model is called
through the openai SDK, so that nothing but ``langchain-core`` is needed (a LangChain
chat model, ``ChatOpenAI(...).bind_tools(TOOLS).invoke(history.messages)``, goes in its
place unchanged). Without OPENAI_API_KEY it calls the scripted demo model of
examples/_upstream.py instead, which it starts on a free port of 127.0.0.1. Settings:
OPENAI_MODEL (default gpt-4.1-mini), COMPACTD_URL (default http://127.0.0.1:8080),
COMPACTD_API_KEY (when compactd has keys), COMPACTD_SESSION (default: a new one).

Needs ``pip install './clients/python[langchain]' openai`` (the dev venv has them).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, cast

from compactd_client import Compactd, CompactdConnectionError, ProblemError
from compactd_client.langchain import CompactdChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from openai import OpenAI
from openai.types.chat import ChatCompletion

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")
COMPACTD_URL = os.environ.get("COMPACTD_URL", "http://127.0.0.1:8080").rstrip("/")
MAX_STEPS = 20
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


@tool
def list_files(path: str = ".") -> str:
    """List a folder of the project, one name a line (folders end in /)."""
    entries = sorted(inside(path).iterdir())
    return "\n".join(p.name + "/" * p.is_dir() for p in entries if not p.name.startswith("."))


@tool
def read_file(path: str) -> str:
    """Read a text file of the project."""
    return inside(path).read_text(encoding="utf-8", errors="replace")[:20_000]


TOOLS: dict[str, BaseTool] = {t.name: t for t in (list_files, read_file)}


def ai_message(response: ChatCompletion) -> AIMessage:
    """The reply as a LangChain chat model gives it: the message and its usage."""
    reply = response.choices[0].message
    fields: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        fields["tool_calls"] = [call.model_dump() for call in reply.tool_calls]
    message = cast(AIMessage, convert_to_messages([fields])[0])
    message.id = response.id
    if response.usage is not None:
        message.usage_metadata = {
            "input_tokens": response.usage.prompt_tokens,
            "output_tokens": response.usage.completion_tokens,
            "total_tokens": response.usage.total_tokens,
        }
    return message


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} TASK")
    task = " ".join(sys.argv[1:])
    if os.environ.get("OPENAI_API_KEY"):
        llm = OpenAI()  # OPENAI_API_KEY, OPENAI_BASE_URL
    else:  # no key: the scripted demo model, on a free port
        from _upstream import start

        _, demo = start()
        print(f"[no OPENAI_API_KEY: the scripted demo model at {demo}]", file=sys.stderr)
        llm = OpenAI(api_key="demo", base_url=f"{demo}/v1")
    schemas = [convert_to_openai_tool(t) for t in TOOLS.values()]
    session_id = os.environ.get("COMPACTD_SESSION") or f"langchain-{uuid.uuid4().hex[:8]}"
    with Compactd(COMPACTD_URL) as compactd:  # and COMPACTD_API_KEY
        history = CompactdChatMessageHistory(session_id, model=MODEL, client=compactd)
        print(f"[compactd session {history.compactd_session_id}]", file=sys.stderr)
        if not history.messages:  # a new conversation: the system prompt goes first
            history.add_message(SystemMessage(SYSTEM))
        history.add_message(HumanMessage(task))
        for _ in range(MAX_STEPS):
            response = llm.chat.completions.create(
                model=MODEL,
                messages=cast(Any, convert_to_openai_messages(history.messages)),
                tools=cast(Any, schemas),
            )
            reply = ai_message(response)
            history.add_message(reply)  # and its usage, reported
            if not reply.tool_calls:
                print(reply.text)
                return
            for call in reply.tool_calls:
                print(f"> {call['name']}({json.dumps(call['args'])})", file=sys.stderr)
                chosen = TOOLS.get(call["name"])
                try:
                    output = str(chosen.invoke(call["args"])) if chosen else "error: no such tool"
                except (OSError, ValueError) as exc:
                    output = f"error: {exc}"
                history.add_message(ToolMessage(output, tool_call_id=str(call["id"])))
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
