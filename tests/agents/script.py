"""The scripted model the agents talk to: it decides each answer from the request.

A task is written for this model as well as for the agent: its text carries a tag,
``[[task NAME STEPS FILLER]]``, and the model answers it by calling the agent's shell
tool STEPS times, then saying it is done. Step ``k`` appends a line to ``NAME.txt`` in
the agent's working directory and prints ``STEP-NAME-k-of-STEPS-FILLER-OK`` after
FILLER lines of numbers (tool output that fills a context window); the model reads the
task and the step it is at from the latest tool result in the request, not from
counting turns or finding the first message, so the script still holds after a
compaction has summarized the early turns away. A newer tag (a resumed session's next
prompt) starts its own task.

A request that offers no tools (an agent's title request, or any side call) gets a
short title.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.upstream_server import Action, Reply, ToolCalls

TITLE = "Scripted task"
_TAG = re.compile(r"\[\[task (?P<name>[a-z0-9_]+) (?P<steps>\d+) (?P<filler>\d+)\]\]")
_STEP = re.compile(r"STEP-(?P<name>[a-z0-9_]+)-(?P<step>\d+)-of-(?P<steps>\d+)-(?P<filler>\d+)-OK")


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    steps: int
    filler: int = 0

    @property
    def tag(self) -> str:
        return f"[[task {self.name} {self.steps} {self.filler}]]"

    def prompt(self) -> str:
        return (
            f"{self.tag} Use your shell tool to run the commands the task needs, in "
            f"this directory, then say DONE-{self.name}."
        )

    def command(self, step: int) -> str:
        filler = f"seq 100000 {100000 + self.filler - 1} && " if self.filler else ""
        return f"{filler}echo 'line {step}' >> {self.name}.txt && echo {self.marker(step)}"

    def marker(self, step: int) -> str:
        return f"STEP-{self.name}-{step}-of-{self.steps}-{self.filler}-OK"

    def final(self) -> str:
        return f"DONE-{self.name}: {self.name}.txt has its {self.steps} lines."

    def file_text(self) -> str:
        return "".join(f"line {k}\n" for k in range(1, self.steps + 1))


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
                elif "content" in part:
                    out.extend(_texts(part["content"]))
        return out
    return []


def conversation(api: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The request's history as ``("user", text)`` and ``("result", text)`` items, in
    order (assistant turns left out)."""
    out: list[tuple[str, str]] = []
    if api == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return [("user", items)]
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message")
            if kind == "message" and item.get("role") == "user":
                out.extend(("user", t) for t in _texts(item.get("content")))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.extend(("result", t) for t in _texts(item.get("output")))
        return out
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if api == "openai":
            if role == "user":
                out.extend(("user", t) for t in _texts(content))
            elif role == "tool":
                out.extend(("result", t) for t in _texts(content))
            continue
        if role != "user":
            continue
        if isinstance(content, str):
            out.append(("user", content))
            continue
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                out.extend(("result", t) for t in _texts(block.get("content")))
            elif isinstance(block.get("text"), str):
                out.append(("user", block["text"]))
    return out


def _tools(api: str, body: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, type, schema)`` of each tool the request offers."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if api == "anthropic":
            name, schema, kind = tool.get("name"), tool.get("input_schema"), "function"
        else:
            fn = tool["function"] if isinstance(tool.get("function"), dict) else tool
            name, schema = fn.get("name"), fn.get("parameters")
            kind = str(tool.get("type", "function"))
        if isinstance(name, str):
            out.append((name, kind, schema if isinstance(schema, dict) else {}))
    return out


# The shell tool of each agent, in the order they are looked for.
SHELL_TOOLS = ("Bash", "bash", "shell", "shell_command", "exec_command")


def shell_call(api: str, body: dict[str, Any], command: str) -> tuple[str, dict[str, Any]]:
    """A call of the request's shell tool running ``command``, its arguments shaped
    after the tool's schema (a string or an argv ``command``, or ``cmd``)."""
    tools = {name: schema for name, kind, schema in _tools(api, body) if kind == "function"}
    for name in SHELL_TOOLS:
        if name not in tools:
            continue
        properties = tools[name].get("properties") or {}
        required = tools[name].get("required") or []
        if "cmd" in properties:
            arguments: dict[str, Any] = {"cmd": command}
        elif (properties.get("command") or {}).get("type") == "array":
            arguments = {"command": ["bash", "-lc", command]}
        else:
            arguments = {"command": command}
        if "description" in properties:
            arguments["description"] = "Run a step of the scripted task"
        if "workdir" in required:
            arguments["workdir"] = "."
        return name, arguments
    offered = sorted(tools)
    raise LookupError(f"no shell tool among the {len(offered)} offered: {offered}")


def respond(api: str, body: dict[str, Any]) -> Action:
    """The answer to one request of an agent working on a tagged task (see the module)."""
    if not body.get("tools"):
        return Reply(TITLE)
    task: Task | None = None
    done = 0
    for kind, text in conversation(api, body):
        if kind == "user":
            for tag in _TAG.finditer(text):
                named = Task(tag["name"], int(tag["steps"]), int(tag["filler"]))
                if task is None or named.name != task.name:
                    task, done = named, 0
        else:
            for step in _STEP.finditer(text):
                if task is None or step["name"] != task.name:
                    task, done = Task(step["name"], int(step["steps"]), int(step["filler"])), 0
                done = max(done, int(step["step"]))
    if task is None:
        return Reply("There is no scripted task in this conversation.")
    if done >= task.steps:
        return Reply(task.final())
    try:
        call = shell_call(api, body, task.command(done + 1))
    except LookupError as e:
        return Reply(str(e))
    return ToolCalls((call,))
