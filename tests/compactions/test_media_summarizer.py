"""Images and documents never reach a summarizer (issue 30): a session holding a
screenshot, a PDF (both base64, as an Anthropic client sends them) and a tool's
image output (an OpenAI data URL) is compacted by a real worker with a real
scripted upstream, a real remote endpoint or no model at all; no request any of
them receives holds a byte of the payloads, the summary carries a pointer line for
each, and the recall tool reads the entry back without its bytes either."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import struct
from typing import Any

import httpx

from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.remote_server import (  # noqa: F401 - the fixtures
    Remote,
    Summary,
    remote_fixture,
    remote_server_fixture,
)
from tests.compactions.worker_support import SHORT, SUMMARY, keep_from, prompt_of
from tests.conftest import make_session
from tests.helpers import append_ok, history
from tests.upstream_server import Reply, Upstream
from tests.webhooks import receiver
from tests.webhooks.receiver import Answer, Inbox
from tests.webhooks.support import create_webhook

# The webhook receiver's fixtures (tests/webhooks/conftest.py does the same).
inbox = receiver.inbox
receiver_server = receiver.receiver_server

MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}
TITLE = "Date parser spec"


def _png(width: int, height: int) -> str:
    """A PNG header of that size, then random bytes: base64 no text could hold."""
    head = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    head += struct.pack(">II", width, height) + b"\x08\x02\x00\x00\x00"
    return base64.b64encode(head + random.Random(width).randbytes(6_000)).decode()


SCREENSHOT = _png(1024, 768)
TOOL_IMAGE = _png(640, 480)
PDF = base64.b64encode(b"%PDF-1.4\n" + random.Random(7).randbytes(9_000)).decode()
# Base64 in words: a tool call's argument, a data URL in a tool's output.
UPLOAD = base64.b64encode(random.Random(11).randbytes(3_000)).decode()
PREVIEW = _png(64, 64)
PAYLOADS = {
    "screenshot": SCREENSHOT,
    "tool image": TOOL_IMAGE,
    "pdf": PDF,
    "upload": UPLOAD,
    "preview": PREVIEW,
}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


async def media_session(client: httpx.AsyncClient, sid: str, **config: Any) -> dict[str, int]:
    """The session; the seqs of the entries holding each medium."""
    await make_session(
        client,
        id=sid,
        model="gpt-4o",
        config={**MANUAL, "compaction": {**MANUAL["compaction"], **config}},
    )
    first = await append_ok(
        client,
        sid,
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Make src/dates.py match the screenshot and the spec.",
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": SCREENSHOT},
                    },
                    {
                        "type": "document",
                        "title": TITLE,
                        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                    },
                ],
            }
        ],
        fmt="anthropic",
    )
    user_seq = first["entries"][0]["seq"] if "entries" in first else None
    await append_ok(
        client,
        sid,
        [
            {
                "role": "assistant",
                "content": "Taking a screenshot of the page.",
                "tool_calls": [_call("s1", "screenshot", {"url": "http://127.0.0.1/dates"})],
            },
            {
                "role": "tool",
                "tool_call_id": "s1",
                "content": [
                    {"type": "text", "text": "captured"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{TOOL_IMAGE}"},
                    },
                ],
            },
        ],
    )
    upload = {"path": "docs/shot.png", "content_base64": UPLOAD}
    await append_ok(
        client,
        sid,
        [
            {
                "role": "assistant",
                "content": "Uploading the screenshot.",
                "tool_calls": [_call("u1", "upload_file", upload)],
            },
            {
                "role": "tool",
                "tool_call_id": "u1",
                "content": f"uploaded docs/shot.png\npreview: data:image/png;base64,{PREVIEW}\ndone",
            },
        ],
    )
    for k in range(4):
        body = "\n".join(f"line {n}: value = {n * k}" for n in range(60))
        await append_ok(
            client,
            sid,
            [
                {
                    "role": "assistant",
                    "content": "Next step.",
                    "tool_calls": [_call(f"r{k}", "bash", {"command": f"cat src/mod{k}.py"})],
                },
                {"role": "tool", "tool_call_id": f"r{k}", "content": body},
            ],
        )
    await append_ok(client, sid, [{"role": "user", "content": "Keep going."}])
    await append_ok(client, sid, [{"role": "assistant", "content": "On it."}])
    await keep_from(client, sid, "user")
    entries = await history(client, sid)
    users = [e for e in entries if e["role"] == "user"]
    tools = [e for e in entries if e["role"] == "tool"]
    seqs = {"user": users[0]["seq"], "tool": tools[0]["seq"]}
    assert user_seq is None or user_seq == seqs["user"]
    return seqs


def pointers(seqs: dict[str, int]) -> list[str]:
    u, t = seqs["user"], seqs["tool"]
    return [
        f"[image image/png 1024x768, seq {u}: history_read from_seq={u} to_seq={u}]",
        f'[document application/pdf "{TITLE}", seq {u}: history_read from_seq={u} to_seq={u}]',
        f"[image image/png 640x480, seq {t}: history_read from_seq={t} to_seq={t}]",
    ]


def assert_no_payload(text: str) -> None:
    for name, payload in PAYLOADS.items():
        # Any run of it: a summarizer must not get a slice either.
        for start in range(0, len(payload) - 64, len(payload) // 8):
            assert payload[start : start + 64] not in text, name
    assert "data:image" not in text
    assert "base64," not in text


def assert_media_block(summary: str, seqs: dict[str, int]) -> None:
    block = summary.split("<media>\n", 1)[1].split("\n</media>", 1)[0]
    for line in pointers(seqs):
        assert line in block.splitlines(), (line, block)


async def test_an_llm_summarizer_receives_pointers_never_the_bytes(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    seqs = await media_session(client, "media-llm")
    upstream.script([Reply(SUMMARY), Reply(SUMMARY), Reply(SHORT), Reply(SHORT)])
    r = await client.post("/v1/sessions/media-llm/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, "media-llm", r.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert upstream.requests
    for request in upstream.requests:
        assert_no_payload(request.body.decode())
    # The transcript the model read points at each medium, where recall opens it.
    prompt = prompt_of(upstream.requests[0])
    for line in pointers(seqs):
        assert line in prompt, (line, prompt[:2000])
    assert "Make src/dates.py match the screenshot and the spec." in prompt
    assert_no_payload(done["summary"])
    assert_media_block(done["summary"], seqs)
    # The context after the compaction carries the pointers too.
    r = await client.get("/v1/sessions/media-llm/context")
    assert r.status_code == 200, r.text
    context = json.dumps(r.json()["messages"])
    assert pointers(seqs)[1].replace('"', '\\"') in context
    # The stored history keeps the bytes as sent: the pointer leads somewhere.
    stored = json.dumps(await history(client, "media-llm", fmt="anthropic"))
    assert SCREENSHOT in stored
    assert PDF in stored


async def test_the_extractive_summary_lists_the_media_without_bytes(
    app: Any, client: httpx.AsyncClient
) -> None:
    seqs = await media_session(client, "media-extractive")
    r = await client.post("/v1/sessions/media-extractive/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    done = await compaction(client, "media-extractive", r.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert_no_payload(done["summary"])
    assert_media_block(done["summary"], seqs)
    # A second compaction carries the block forward: the media stay reachable.
    await append_ok(
        client,
        "media-extractive",
        [
            {"role": "user", "content": "Now the week numbers."},
            {"role": "assistant", "content": "Looking."},
        ],
    )
    for k in range(3):
        await append_ok(
            client,
            "media-extractive",
            [
                {
                    "role": "assistant",
                    "content": "Reading.",
                    "tool_calls": [_call(f"w{k}", "bash", {"command": f"cat src/week{k}.py"})],
                },
                {"role": "tool", "tool_call_id": f"w{k}", "content": "x = 1\n" * 80},
            ],
        )
    await append_ok(client, "media-extractive", [{"role": "user", "content": "Go on."}])
    await keep_from(client, "media-extractive", "user")
    r = await client.post("/v1/sessions/media-extractive/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    again = await compaction(client, "media-extractive", r.json()["id"])
    assert again["status"] == "succeeded", again
    assert_no_payload(again["summary"])
    assert_media_block(again["summary"], seqs)


async def test_a_remote_summarizer_receives_pointers_never_the_bytes(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    seqs = await media_session(client, "media-remote", remote_endpoint=remote.url)
    remote.script([Summary(SUMMARY), Summary(SUMMARY), Summary(SHORT), Summary(SHORT)])
    r = await client.post("/v1/sessions/media-remote/compactions", json={})
    assert r.status_code == 202, r.text
    config = dataclasses.replace(worker_config(), remote_timeout_seconds=5.0)
    assert await drain(app, config) == 1
    done = await compaction(client, "media-remote", r.json()["id"])
    assert done["status"] == "succeeded", done
    assert remote.requests
    for request in remote.requests:
        body = json.dumps(request.json)
        assert_no_payload(body)
    assert pointers(seqs)[0] in remote.requests[0].json["prompt"]
    assert_media_block(done["summary"], seqs)


async def test_a_compaction_hook_receives_pointers_never_the_bytes(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    """A ``compaction.before`` hook is sent the conversation as the summarizer reads
    it: the media as pointers."""
    await create_webhook(client, url=inbox.url("hook"), hook=True, types=["compaction.before"])
    inbox.script("hook", [Answer(200, {"cancel": True, "reason": "looked"})])
    seqs = await media_session(client, "media-hook")
    r = await client.post("/v1/sessions/media-hook/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app, worker_config()) == 1
    [call] = inbox.received("hook")
    assert_no_payload(call.body.decode())
    conversation = call.json["data"]["conversation"]
    for line in pointers(seqs):
        assert line in conversation, (line, conversation[:2000])


async def test_history_read_shows_what_a_medium_is_without_its_bytes(
    app: Any, client: httpx.AsyncClient
) -> None:
    seqs = await media_session(client, "media-recall")
    u = seqs["user"]
    call = _call("h1", "history_read", {"from_seq": u, "to_seq": u})
    r = await client.post("/v1/sessions/media-recall/tool-calls", json={"tool_call": call})
    assert r.status_code == 200, r.text
    text = json.dumps(r.json())
    assert_no_payload(text)
    assert "[image image/png 1024x768]" in text
    # history_read reads the OpenAI rendering, where an Anthropic document is a
    # placeholder (app.engine.formats.opaque.placeholder); the pointer in the summary
    # names it, and the history API gives it back whole.
    assert "[Anthropic document block omitted]" in text


async def test_an_image_is_counted_on_write_by_the_session_models_rule(
    client: httpx.AsyncClient,
) -> None:
    """The same 1000x1000 image costs 765 tokens to gpt-4o (OpenAI's tiles), 1,334 to
    Claude (pixels over 750), 1,032 to Gemini (four 258-token tiles), counted once,
    when the message is stored."""
    image = _png(1000, 1000)
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What does the chart show?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        ],
    }
    stored: dict[str, int] = {}
    for model in ("gpt-4o", "claude-sonnet-4-20250514", "gemini-2.5-pro"):
        s = await make_session(client, model=model, config=MANUAL)
        await append_ok(client, s["id"], [message])
        (entry,) = await history(client, s["id"])
        stored[model] = entry["tokens"]
    assert stored["claude-sonnet-4-20250514"] - stored["gpt-4o"] == 1_334 - 765
    assert stored["gemini-2.5-pro"] - stored["gpt-4o"] == 1_032 - 765


async def test_a_branch_summary_receives_pointers_never_the_bytes(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """Navigating away from a branch that holds a screenshot: the branch summary's
    summarizer reads a pointer, and the summary lists it."""
    await make_session(client, id="media-branch", config=MANUAL)
    await append_ok(
        client,
        "media-branch",
        [
            {"role": "user", "content": "Fix the date parser in src/dates.py."},
            {"role": "assistant", "content": "I will look first."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "This is what the page shows."},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{SCREENSHOT}"},
                    },
                ],
            },
            {"role": "assistant", "content": "The week column is off by one."},
        ],
    )
    r = await client.post("/v1/sessions/media-branch/navigate", json={"seq": 2, "summarize": True})
    assert r.status_code == 202, r.text
    upstream.script([Reply(SUMMARY), Reply(SUMMARY), Reply(SHORT), Reply(SHORT)])
    assert await drain(app, worker_config(upstream)) == 1
    assert upstream.requests
    for request in upstream.requests:
        assert_no_payload(request.body.decode())
    pointer = "[image image/png 1024x768, seq 3: history_read from_seq=3 to_seq=3]"
    assert pointer in prompt_of(upstream.requests[0])
    job = await compaction(client, "media-branch", r.json()["branch_summary"]["id"])
    assert job["status"] == "succeeded", job
    assert pointer in job["summary"].split("<media>", 1)[1]
