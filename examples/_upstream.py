"""A scripted demo model, so that the examples run without a provider's API key: a tiny
HTTP server (the standard library only) on 127.0.0.1 that answers OpenAI's
``POST /v1/chat/completions`` and Anthropic's ``POST /v1/messages`` as a model would.

Its script: to a request that offers tools, a call of the first tool (its arguments
made from the tool's schema: defaults, else "."); once a tool's result is back, a short
text answer ("... the task is done."). It does not stream.

The explicit examples start it themselves, on a free port, when ``OPENAI_API_KEY`` (or
``ANTHROPIC_API_KEY``) is not set. For the proxy examples compactd is the one that
calls the model, so start it on a port of your choice and point compactd at it:

    python examples/_upstream.py --port 8900 &
    COMPACTD_PROXY_OPENAI_URL=http://127.0.0.1:8900/v1 \\
    COMPACTD_PROXY_ANTHROPIC_URL=http://127.0.0.1:8900 make run
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DONE = "That is all I needed: the task is done."
_ids = itertools.count(1)


def _arguments(schema: Any) -> dict[str, Any]:
    """Arguments for a tool's JSON schema: each required property (or each property, if
    none is required) at its default, else "."."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties") or {}
    wanted = schema.get("required") or list(properties)
    return {
        name: (properties.get(name) or {}).get("default", ".")
        for name in wanted
        if isinstance(name, str)
    }


def _first_tool(api: str, tools: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    tool = tools[0]
    if api == "openai":
        function = tool.get("function")
        fn: dict[str, Any] = function if isinstance(function, dict) else tool
        name, schema = fn.get("name"), fn.get("parameters")
    else:
        name, schema = tool.get("name"), tool.get("input_schema")
    return (name, _arguments(schema)) if isinstance(name, str) and name else None


def _after_tool_result(api: str, messages: list[Any]) -> bool:
    last = messages[-1] if messages else None
    if not isinstance(last, dict):
        return False
    if api == "openai":
        return last.get("role") == "tool"
    content = last.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def answer(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The demo model's reply to one request, in the API's own shape."""
    messages = body.get("messages") or []
    model = body.get("model") or "demo"
    n = next(_ids)
    prompt_tokens = max(1, len(json.dumps(body)) // 4)  # about what a tokenizer counts
    tool = None if _after_tool_result(api, messages) else _first_tool(api, body.get("tools"))
    if tool is None:
        text = (
            f"The tool answered ({len(json.dumps(messages[-1]))} bytes). {DONE}"
            if _after_tool_result(api, messages)
            else f"Hello from the scripted demo model: I read {len(messages)} messages."
        )
    if api == "openai":
        if tool is None:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = "stop"
        else:
            call = {
                "id": f"call_demo_{n}",
                "type": "function",
                "function": {"name": tool[0], "arguments": json.dumps(tool[1])},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        return {
            "id": f"chatcmpl-demo-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 20,
                "total_tokens": prompt_tokens + 20,
            },
        }
    if tool is None:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        stop = "end_turn"
    else:
        content = [{"type": "tool_use", "id": f"toolu_demo_{n}", "name": tool[0], "input": tool[1]}]
        stop = "tool_use"
    return {
        "id": f"msg_demo_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 20},
    }


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        api = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}.get(path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if api is None:
            self._send(404, {"error": {"type": "not_found", "message": f"no route {path}"}})
        elif not isinstance(body, dict) or body.get("stream"):
            message = "the demo model takes a JSON object and does not stream"
            self._send(400, {"error": {"type": "invalid_request_error", "message": message}})
        else:
            self._send(200, answer(api, body))

    def _send(self, status: int, document: dict[str, Any]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the examples print what matters


def start(port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """The demo model serving in a background thread on 127.0.0.1 (``port`` 0: a free
    one); the server (``shutdown()`` ends it) and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description="A scripted demo model for the examples.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    port = parser.parse_args().port
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"scripted demo model at {url} (OpenAI base URL {url}/v1, Anthropic {url})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
