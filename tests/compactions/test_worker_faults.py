"""The compaction worker against a real scripted upstream LLM and a real Postgres:
what it sends, what it stores, and how every upstream fault ends (seed 004 §4,
issue 4 "Bad input and faults"). No mocks: the worker runs for real
(``drain``), the upstream is a real HTTP server, the API is read over HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.compactions.repository import CompactionRepository
from app.compactions.worker import CRASH_SLACK
from app.core.database import driver_connection
from app.engine.compaction.summary import SPLIT_TURN_SEPARATOR
from app.prompts import load_prompt
from tests.compactions.helpers import compaction, conversation, drain, worker_config
from tests.compactions.worker_support import (
    SHORT,
    SUMMARY,
    assert_api_answers,
    compaction_count,
    compaction_entries,
    expire_lease,
    keep_from,
    prompt_of,
    request_compaction,
    seeded,
    system_of,
)
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history, tool_call
from tests.upstream_server import (
    Close,
    Drip,
    Empty,
    Garbage,
    Hang,
    Reply,
    Status,
    Upstream,
)

READ_FILES = [f"src/mod{k}.py" for k in range(10)]  # read before the last user message
# What a summary of seeded(client, 12) opens with: the user's requests it replaces.
REQUESTS = """<user-requests>
The user's requests as written: the first, then the latest (oldest first).
<request seq="2" first="true">
Fix the failing date parser in src/dates.py. Never edit tests/.
</request>
<request seq="14">
Keep going with part 1.
</request>
</user-requests>"""


def _between(text: str, start: str, end: str) -> str:
    assert start in text, text[:200]
    assert end in text, text[:200]
    return text.split(start, 1)[1].split(end, 1)[0]


def _usage(api: str, prompt: int, completion: int) -> dict[str, int]:
    if api == "openai":
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return {"input_tokens": prompt, "output_tokens": completion}


# --- success --------------------------------------------------------------------


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_llm_summary_comes_from_the_upstream_reply(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, api: str
) -> None:
    sid = await seeded(client, 12)
    upstream.script(
        [
            Reply(SUMMARY, usage=_usage(api, 3000, 120), model="summarizer-2025"),
            Reply(
                SHORT + "\nsecond line dropped",
                usage=_usage(api, 200, 12),
                model="summarizer-2025",
            ),
        ]
    )
    job = await request_compaction(
        client, sid, instructions="Focus on the timezone handling.", model="summarizer-mini"
    )

    assert await drain(app, worker_config(upstream, api=api)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer"] == "llm"
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 1
    assert done["error"] is None
    # The reply itself, then the files read (never modified here), in tags, then
    # the user's requests it replaces, verbatim (the first, then the later one;
    # the last is kept).
    files = "\n".join(READ_FILES)
    assert done["summary"] == (f"{SUMMARY}\n\n<read-files>\n{files}\n</read-files>\n\n{REQUESTS}")
    assert done["short_summary"] == SHORT
    assert done["upstream_model"] == "summarizer-2025"
    assert done["upstream_usage"] == {"input_tokens": 3200, "output_tokens": 132}
    assert done["details"]["read_files"] == READ_FILES
    assert done["details"]["modified_files"] == []
    assert done["details"]["split_turn"] is False
    assert done["details"]["notes"] == []
    assert done["tokens_after"] < done["tokens_before"]

    requests = upstream.requests
    assert len(requests) == 2
    main, short = requests
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    for request in requests:
        assert request.path == path
        assert request.json["model"] == "summarizer-mini"
        for offered in ("tools", "tool_choice", "functions"):
            assert offered not in request.json
        assert system_of(request) == load_prompt("system")
        if api == "openai":
            assert request.headers["authorization"] == "Bearer sk-test"
            assert request.json["stream"] is False
        else:
            assert request.headers["x-api-key"] == "sk-test"
            assert request.headers["anthropic-version"]
    prompt = prompt_of(main)
    assert prompt.startswith("<conversation>\n[User]: Fix the failing date parser")
    assert "</conversation>" in prompt
    assert "<previous-summary>" not in prompt
    assert '[Assistant tool calls]: bash(command="cat src/mod0.py")' in prompt
    assert "Focus on the timezone handling." in prompt
    # The kept turn (the last user message on) is not summarized.
    assert "Keep going with part 2." not in prompt
    assert "Keep going with part 1." in prompt
    short_prompt = prompt_of(short)
    assert short_prompt.startswith(f"<summary>\n{SUMMARY}\n</summary>")
    assert load_prompt("short") in short_prompt

    # The context now opens with the summary, the kept turn after it.
    r = await client.get(f"/v1/sessions/{sid}/context")
    assert r.status_code == 200, r.text
    texts = [m.get("content") for m in r.json()["messages"]]
    assert any(isinstance(t, str) and SUMMARY in t for t in texts)
    assert "Keep going with part 2." in texts
    assert "Keep going with part 1." not in texts
    session = await get_session(client, sid)
    assert session["compaction_count"] == 1
    assert session["active_compaction_id"] is None


async def test_split_turn_gets_a_turn_prefix_summary(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12, cut="split")
    history_summary = "## Goal\nFix the date parser.\n\n## Progress\n- Read modules 0 to 4."
    prefix_summary = "## Original Request\nKeep going with part 1.\n\n## Early Progress\n- mod5-7"
    upstream.script([Reply(history_summary), Reply(prefix_summary), Reply(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["details"]["split_turn"] is True
    assert SPLIT_TURN_SEPARATOR.strip() == "---\n\n**Turn Context (split turn):**"
    body = done["summary"].split("\n\n<read-files>")[0]
    assert body == history_summary + SPLIT_TURN_SEPARATOR + prefix_summary
    assert "**Turn Context (split turn):**" in done["summary"]
    requests = upstream.requests
    assert len(requests) == 3
    history_prompt, prefix_prompt, short_prompt = (prompt_of(r) for r in requests)
    # The history ends where the split turn begins; the prefix is that turn's start.
    assert "Keep going with part 1." not in history_prompt
    assert "cat src/mod4.py" in history_prompt
    assert prefix_prompt.startswith("<conversation>\n[User]: Keep going with part 1.")
    assert "cat src/mod8.py" in prefix_prompt
    assert "cat src/mod9.py" not in prefix_prompt  # the kept rest of the turn
    assert "cat src/mod9.py" not in history_prompt
    assert load_prompt("turn_prefix") in prefix_prompt
    assert load_prompt("turn_prefix") not in history_prompt
    # The short title is asked of the history summary.
    assert history_summary in short_prompt


async def test_extractive_on_request_or_without_an_upstream_never_calls_one(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    asked = await seeded(client, 12)
    unset = await seeded(client, 12)
    by_request = await request_compaction(client, asked, summarizer="extractive")
    assert await drain(app, worker_config(upstream)) == 1
    no_upstream = await request_compaction(client, unset)
    assert await drain(app, worker_config(None)) == 1

    assert upstream.requests == []
    done = await compaction(client, asked, by_request["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer"] == "extractive"
    assert done["summarizer_used"] == "extractive"
    assert done["error"] is None
    assert done["details"]["notes"] == []
    assert done["upstream_model"] is None
    assert done["upstream_usage"] is None
    assert (
        done["short_summary"] == "Fix the failing date parser in src/dates.py. Never edit tests/."
    )
    fallback = await compaction(client, unset, no_upstream["id"])
    assert fallback["status"] == "succeeded", fallback
    assert fallback["summarizer"] == "llm"
    assert fallback["summarizer_used"] == "extractive"
    assert fallback["details"]["notes"] == ["no upstream LLM is configured: extractive summary"]
    # Not an error: extractive is the documented default without an upstream.
    assert fallback["error"] is None
    # Same entries, same deterministic summary.
    assert fallback["summary"] == done["summary"]


# --- faults -----------------------------------------------------------------------


async def test_429_with_retry_after_requeues_the_job_until_then(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    upstream.script([Status(429, headers={"Retry-After": "1"}), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)
    config = worker_config(upstream)  # backoff base and cap 0: Retry-After is the delay
    assert config.backoff.base_seconds == 0
    assert config.backoff.cap_seconds == 0

    before = datetime.now(UTC)
    assert await drain(app, config) == 1  # one claim; the retry is not due yet
    after = datetime.now(UTC)

    waiting = await compaction(client, sid, job["id"])
    assert waiting["status"] == "queued", waiting
    assert waiting["attempts"] == 1
    assert "rate_limited" in waiting["error"]
    assert "429" in waiting["error"]
    assert waiting["summary"] is None
    assert waiting["finished_at"] is None
    assert waiting["details"]["notes"] == [f"attempt 1: {waiting['error']}"]
    due = datetime.fromisoformat(waiting["next_attempt_at"])
    # Retry-After is the floor, and with no backoff it is the whole delay.
    assert before + timedelta(seconds=1) <= due <= after + timedelta(seconds=1)
    assert len(upstream.requests) == 1
    session = await get_session(client, sid)
    assert session["active_compaction_id"] == job["id"]
    assert session["compaction_count"] == 0
    await assert_api_answers(client, sid)
    # A second manual request gets the same job back.
    again = await client.post(f"/v1/sessions/{sid}/compactions", json={})
    assert again.status_code == 202
    assert again.json()["id"] == job["id"]

    assert await drain(app, config) == 0  # not yet due
    assert len(upstream.requests) == 1
    await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.05)
    assert await drain(app, config) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 2
    assert done["summary"].startswith(SUMMARY)
    assert done["error"] is None
    assert done["details"]["notes"] == waiting["details"]["notes"]
    assert len(upstream.requests) == 3
    assert upstream.requests[1].at - upstream.requests[0].at >= 1.0
    assert await compaction_count(client, sid) == 1


@pytest.mark.parametrize(
    ("api", "fault", "kind"),
    [
        ("openai", Status(500), "server"),
        ("anthropic", Status(529), "server"),
        ("openai", Status(503), "server"),
        ("openai", Empty(), "empty"),
        ("anthropic", Empty(), "empty"),
        ("openai", Garbage(), "malformed"),
        ("openai", Reply("Sure!"), "empty"),  # too short to be a summary
        ("openai", Close(), "connection"),
    ],
    ids=["500", "529", "503", "empty", "empty-anthropic", "garbage", "unusable", "close"],
)
async def test_retryable_fault_then_success(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, api: str, fault: Any, kind: str
) -> None:
    sid = await seeded(client, 12)
    upstream.script([fault, Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, api=api)) == 2  # the retry ran at once

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 2
    assert done["summary"].startswith(SUMMARY)
    assert done["short_summary"] == SHORT
    assert done["error"] is None
    # Why the first attempt was retried stays on record.
    [note] = done["details"]["notes"]
    assert note.startswith(f"attempt 1: upstream {kind}: "), note
    assert len(upstream.requests) == 3
    # The failed first attempt sent the same prompt as the one that worked.
    assert prompt_of(upstream.requests[0]) == prompt_of(upstream.requests[1])
    assert await compaction_count(client, sid) == 1
    assert len(await compaction_entries(client, sid)) == 1
    await assert_api_answers(client, sid)


# Alone in a parallel run: the retry's answer must come within the same 0.5 s deadline.
@pytest.mark.alone
@pytest.mark.parametrize("fault", [Hang(10), Drip(interval=0.1, chunk=8)], ids=["hang", "drip"])
async def test_slow_upstream_times_out_and_is_retried(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, fault: Any
) -> None:
    sid = await seeded(client, 12)
    upstream.script([fault, Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)

    started = time.monotonic()
    assert await drain(app, worker_config(upstream, timeout_seconds=0.5)) == 2
    assert time.monotonic() - started < 5  # cut off at the deadline, not waited out

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 2
    [note] = done["details"]["notes"]
    assert note.startswith("attempt 1: upstream timeout: "), note
    assert "0.5 s" in note, note
    assert done["summary"].startswith(SUMMARY)
    assert len(upstream.requests) == 3
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_repeated_server_errors_fall_back_to_extractive(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, api: str
) -> None:
    sid = await seeded(client, 12)
    code = 500 if api == "openai" else 529
    upstream.script([Status(code)] * 3 + [Reply(SUMMARY)] * 3)
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, api=api, max_attempts=3)) == 3

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer"] == "llm"
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 3
    assert len(upstream.requests) == 3  # no call after the last attempt failed
    assert upstream.pending == 3
    notes = done["details"]["notes"]
    assert len(notes) == 3, notes
    assert notes[0].startswith("attempt 1: upstream server: ")
    assert f"HTTP {code}" in notes[0]
    assert notes[1].startswith("attempt 2: upstream server: ")
    assert f"HTTP {code}" in notes[1]
    assert notes[2].startswith("upstream server (attempt 3): ")
    assert f"HTTP {code}" in notes[2]
    assert notes[2].endswith("used extractive")
    assert done["error"] == "; ".join(notes)
    assert done["upstream_usage"] is None
    assert (
        done["short_summary"] == "Fix the failing date parser in src/dates.py. Never edit tests/."
    )
    # The extractive summary, from the entries themselves, with the files.
    assert "Fix the failing date parser in src/dates.py" in done["summary"]
    assert "Never edit tests/." in done["summary"]
    assert "<read-files>\nsrc/mod0.py" in done["summary"]
    assert SUMMARY not in done["summary"]
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


@pytest.mark.parametrize(
    "fault",
    [
        Status(400),
        Status(401),
        Status(404),
        Status(429, body={"error": {"message": "quota", "code": "insufficient_quota"}}),
    ],
    ids=["400", "401", "404", "429-out-of-credit"],
)
async def test_non_retryable_error_falls_back_at_once(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, fault: Status
) -> None:
    sid = await seeded(client, 12)
    upstream.script([fault, Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, max_attempts=3)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 1
    assert len(upstream.requests) == 1
    assert f"HTTP {fault.code}" in done["error"]
    assert done["details"]["notes"] == [done["error"]]
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


async def test_short_summary_failure_keeps_the_llm_summary(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    upstream.script([Reply(SUMMARY), Status(500)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 1
    assert done["summary"].startswith(SUMMARY)
    assert done["short_summary"]  # taken from the summary instead
    assert done["short_summary"] in SUMMARY
    assert any("short summary" in note for note in done["details"]["notes"])
    assert len(upstream.requests) == 2


async def test_context_overflow_summarizes_in_chunks(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 30)
    # The summarizer model said its window is 4,096 tokens: the transcript is cut
    # into pieces that fit, each one updating the summary of the ones before.
    overflow = Status(
        400,
        body={
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, your "
                "messages resulted in 21000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )
    chunk_replies = [
        Reply(f"## Goal\nFix the date parser.\n\n## Progress\n- chunk {k} read") for k in range(40)
    ]
    upstream.script([overflow, *chunk_replies])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 1
    requests = upstream.requests
    whole, chunks, short = requests[0], requests[1:-1], requests[-1]
    assert len(chunks) >= 3, len(chunks)
    assert "[User]: Fix the failing date parser" in prompt_of(whole)
    assert "[User]: Fix the failing date parser" in prompt_of(chunks[0])
    assert "<previous-summary>" not in prompt_of(chunks[0])
    for k, request in enumerate(chunks[1:], start=1):
        prompt = prompt_of(request)
        assert prompt.startswith(
            "<previous-summary>\n## Goal\nFix the date parser.\n\n## Progress\n"
            f"- chunk {k - 1} read\n</previous-summary>"
        ), prompt[:300]
        assert "<conversation>" in prompt
    # Every chunk fits the window the upstream stated.
    for request in chunks:
        assert len(request.body) < 4096 * 4, len(request.body)
    # The transcript reached the end of what is summarized, and no further.
    # Together the chunks hold every summarized result once, and nothing kept.
    transcripts = [_between(prompt_of(r), "<conversation>\n", "\n</conversation>") for r in chunks]
    ids = [i for k in range(25) for i in ([f"c{k}a", f"c{k}b"] if k % 4 == 3 else [f"c{k}"])]
    for call_id in ids:
        found = sum(t.count(f"[Tool result bash {call_id}]: ") for t in transcripts)
        assert found == 1, (call_id, found)
    assert not any("c25" in t or "part 5" in t for t in transcripts)
    last = len(chunks) - 1
    assert done["summary"].startswith(
        f"## Goal\nFix the date parser.\n\n## Progress\n- chunk {last} read"
    )
    assert "<read-files>" in done["summary"]
    assert "<summary>" in prompt_of(short)
    assert await compaction_count(client, sid) == 1


# --- the second compaction ------------------------------------------------------------


async def test_second_compaction_updates_the_previous_summary_and_files_add_up(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    first = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    first = await compaction(client, sid, first["id"])
    assert first["status"] == "succeeded", first
    assert first["summarizer_used"] == "llm", first

    write = tool_call("w1", "write", '{"path": "src/dates.py", "content": "def parse(): ..."}')
    edit = tool_call(
        "e1", "edit", '{"file_path": "src/util.py", "old_string": "a", "new_string": "b"}'
    )
    read = tool_call("r1", "read", '{"path": "docs/dates.md"}')
    batches: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "Now write the fix. " + "Context. " * 300}],
        [{"role": "assistant", "content": "Writing it.", "tool_calls": [write, read]}],
        [
            {"role": "tool", "tool_call_id": "w1", "content": "written " + "ok " * 400},
            {"role": "tool", "tool_call_id": "r1", "content": "# Dates\n" + "doc " * 400},
        ],
        [{"role": "assistant", "content": "And the helper.", "tool_calls": [edit]}],
        [{"role": "tool", "tool_call_id": "e1", "content": "edited " + "ok " * 400}],
        [{"role": "user", "content": "Run the tests."}],
        [{"role": "assistant", "content": "Running them now. " + "detail " * 300}],
    ]
    for batch in batches:
        await append_ok(client, sid, batch)
    await keep_from(client, sid, "user")
    second_summary = "## Goal\nFix the date parser.\n\n## Progress\n- Wrote src/dates.py."
    upstream.script([Reply(second_summary), Reply(SHORT)])
    second = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1

    second = await compaction(client, sid, second["id"])
    assert second["status"] == "succeeded", second
    assert second["summarizer_used"] == "llm", second
    prompt = prompt_of(upstream.requests[2])
    # The previous summary (as stored, files and all) is carried into the update
    # prompt, but for the user's requests it quoted: the new summary quotes them
    # again itself, and a model shown them would only copy them.
    assert first["summary"].endswith(f"</read-files>\n\n{REQUESTS}")
    carried = first["summary"].removesuffix(f"\n\n{REQUESTS}")
    assert prompt.startswith(f"<previous-summary>\n{carried}\n</previous-summary>\n\n")
    assert "<user-requests>" not in prompt
    assert load_prompt("update").splitlines()[0] in prompt
    conversation = _between(prompt, "<conversation>\n", "\n</conversation>")
    assert conversation.startswith("[User]: Keep going with part 2.")  # kept last time
    assert "Keep going with part 1." not in conversation  # summarized last time
    assert "compacted into the following summary" not in conversation
    assert "Now write the fix." in conversation
    assert "Run the tests." not in conversation  # kept this time

    # The file lists add up across compactions; a file written is modified only.
    read_files = sorted([*READ_FILES, "docs/dates.md", "src/mod10.py", "src/mod11.py"])
    assert first["details"]["read_files"] == READ_FILES
    assert second["details"]["read_files"] == read_files
    assert second["details"]["modified_files"] == ["src/dates.py", "src/util.py"]
    summary, block = second["summary"].split("\n\n<user-requests>\n")
    assert summary == (
        f"{second_summary}\n\n<read-files>\n"
        + "\n".join(read_files)
        + "\n</read-files>\n<modified-files>\nsrc/dates.py\nsrc/util.py\n</modified-files>"
    )
    # The requests: the first, carried from the first compaction's details with
    # the later one it quoted, then the two this one summarized, all verbatim.
    seqs = {e["message"]["content"]: e["seq"] for e in await history(client, sid)}
    written = [
        "Fix the failing date parser in src/dates.py. Never edit tests/.",
        "Keep going with part 1.",
        "Keep going with part 2.",
        "Now write the fix. " + "Context. " * 300,
    ]
    quoted = re.findall(r'<request seq="(\d+)"[^>]*>\n(.*?)\n</request>', block, re.S)
    assert quoted == [(str(seqs[text]), text) for text in written]
    assert block.endswith("</user-requests>")
    assert await compaction_count(client, sid) == 2
    assert len(await compaction_entries(client, sid)) == 2
    # The archive of the second holds exactly what it replaced.
    r = await client.get(f"/v1/sessions/{sid}/compactions/{second['id']}/source")
    assert r.status_code == 200, r.text
    replaced = r.json()["entries"]
    assert replaced[0]["message"]["content"] == "Keep going with part 2."
    assert replaced[-1]["message"]["content"].startswith("edited ok")
    span = range(first["first_kept_seq"], second["first_kept_seq"])
    assert [e["seq"] for e in replaced] == [s for s in span if s != first["entry_seq"]]
    assert all(e["kind"] != "compaction" for e in replaced)


# --- loop guards ----------------------------------------------------------------------


async def _crash_loop(app: Any, job_id: str, max_attempts: int) -> None:
    """Claims of ``job_id`` by workers that die at once: each claim's lease is
    moved into the past, so the next claim takes the job again."""
    engine = app.state.engine
    for claim in range(1, max_attempts + CRASH_SLACK + 1):
        async with driver_connection(engine) as driver:
            job = await CompactionRepository("").claim(driver, f"doomed-{claim}", 30.0)
        assert job is not None, job
        assert str(job.id) == job_id, job
        assert job.attempts == claim
        assert job.status == "running"
        await expire_lease(engine, job.id)


async def test_three_failed_automatic_compactions_stop_them_until_a_manual_one_succeeds(
    app: Any, client: httpx.AsyncClient
) -> None:
    s = await make_session(
        client,
        model="gpt-4o",
        context_window=20_000,
        max_output_tokens=2_000,
        config={
            "compaction": {"threshold": 0.5, "keep_recent_tokens": 2_000},
            "prune": {"enabled": False},
        },
    )
    sid = s["id"]
    config = worker_config(max_attempts=1)
    auto: list[str] = []
    for batch in conversation(12):
        answer = await append_ok(client, sid, batch)
        if answer["compaction"] is not None:
            auto.append(answer["compaction"]["id"])
    assert len(auto) == 1, auto  # one at a time: later appends found it queued
    assert answer["overflow"]["action"] == "compact"

    for round_ in range(1, 4):
        job_id = auto[-1]
        job = await compaction(client, sid, job_id)
        assert job["auto"] is True
        assert job["reason"] == "threshold"
        await _crash_loop(app, job_id, max_attempts=1)
        assert await drain(app, config) == 1
        failed = await compaction(client, sid, job_id)
        assert failed["status"] == "failed", failed
        assert failed["attempts"] == 1 + CRASH_SLACK + 1
        assert "gave up" in failed["error"]
        assert failed["summary"] is None
        session = await get_session(client, sid)
        assert session["compaction_failures"] == round_
        assert session["active_compaction_id"] is None
        assert session["compaction_count"] == 0
        await assert_api_answers(client, sid)
        answer = await append_ok(client, sid, [{"role": "user", "content": f"Go on ({round_})."}])
        assert answer["overflow"]["action"] == "compact"
        if round_ < 3:
            assert session["auto_compaction"] == "on"
            assert answer["compaction"] is not None, answer
            assert answer["compaction"]["created"], answer
            auto.append(answer["compaction"]["id"])
        else:
            assert session["auto_compaction"] == "stopped"
            assert answer["compaction"] is None, answer  # the guard holds

    r = await client.post(
        f"/v1/sessions/{sid}/usage", json={"input_tokens": 11_000, "output_tokens": 10}
    )
    assert r.status_code == 200, r.text
    assert r.json()["overflow"]["action"] == "compact"
    assert r.json()["compaction"] is None
    listed = (await client.get(f"/v1/sessions/{sid}/compactions")).json()["compactions"]
    assert [c["status"] for c in listed] == ["failed"] * 3
    assert await drain(app, config) == 0

    manual = await request_compaction(client, sid)
    assert await drain(app, config) == 1
    done = await compaction(client, sid, manual["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive", done
    session = await get_session(client, sid)
    assert session["compaction_failures"] == 0
    assert session["auto_compaction"] == "on"
    assert session["compaction_count"] == 1


# --- what an upstream sends is cleaned before it is stored ------------------------
#
# Postgres stores neither NUL nor a lone surrogate. Every string the upstream sends
# (its model, its error message, its finish reason) is cleaned at the client's
# boundary, as the summary text is: one odd character must neither throw a good
# summary away nor make the job's retry record unwritable.


def _raw_openai_reply(text: str, model_json: str) -> str:
    """An OpenAI reply as raw JSON text, so that its model can hold escapes (a lone
    surrogate) that no JSON encoder writes."""
    return (
        '{"id": "chatcmpl-raw", "object": "chat.completion", "model": "' + model_json + '", '
        '"choices": [{"index": 0, "message": {"role": "assistant", "content": '
        + json.dumps(text)
        + '}, "finish_reason": "stop\\u0000"}], '
        '"usage": {"prompt_tokens": 3000, "completion_tokens": 120}}'
    )


@pytest.mark.parametrize(
    ("api", "main", "short", "model"),
    [
        (
            "openai",
            Reply(SUMMARY, model="summarizer\x00-2025", finish_reason="stop\x00"),
            Reply(SHORT, model="summarizer\x00-2025"),
            "summarizer-2025",
        ),
        (
            "anthropic",
            Reply(SUMMARY, model="summarizer\x00-2025", finish_reason="end_turn\x00"),
            Reply(SHORT, model="summarizer\x00-2025"),
            "summarizer-2025",
        ),
        (
            "openai",
            Status(200, body=_raw_openai_reply(SUMMARY, "summarizer\\ud800-2025")),
            Status(200, body=_raw_openai_reply(SHORT, "summarizer\\ud800-2025")),
            "summarizer?-2025",
        ),
    ],
    ids=["nul-openai", "nul-anthropic", "lone-surrogate-openai"],
)
async def test_an_odd_character_in_the_replys_model_keeps_the_summary(
    app: Any,
    client: httpx.AsyncClient,
    upstream: Upstream,
    api: str,
    main: Any,
    short: Any,
    model: str,
) -> None:
    sid = await seeded(client, 12)
    upstream.script([main, short])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, api=api)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 1
    assert done["error"] is None
    assert done["summary"].startswith(SUMMARY)
    assert done["short_summary"] == SHORT
    assert done["upstream_model"] == model
    assert done["upstream_usage"]["input_tokens"] > 0
    assert done["details"]["notes"] == []
    assert len(upstream.requests) == 2  # two paid calls, both kept
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


_NUL_500 = Status(
    500, body={"error": {"message": "The engine\x00 is overloaded", "type": "server_error"}}
)
_NUL_529 = Status(
    529,
    body={"type": "error", "error": {"type": "overloaded_error", "message": "Over\x00loaded now"}},
)
_SURROGATE_500 = Status(
    500, body='{"error": {"message": "bad gateway \\ud800 upstream", "type": "server_error"}}'
)
_NUL_400 = Status(
    400,
    body={"error": {"message": "Unknown\x00 parameter: top_k", "type": "invalid_request_error"}},
)


@pytest.mark.parametrize(
    ("api", "fault", "said", "attempts"),
    [
        ("openai", _NUL_500, "The engine is overloaded", 3),
        ("anthropic", _NUL_529, "Overloaded now", 3),
        ("openai", _SURROGATE_500, "bad gateway ? upstream", 3),
        ("openai", _NUL_400, "Unknown parameter: top_k", 1),
    ],
    ids=["nul-500", "nul-529-anthropic", "lone-surrogate-500", "nul-400"],
)
async def test_an_odd_character_in_an_upstream_error_is_recorded_as_the_upstreams_error(
    app: Any,
    client: httpx.AsyncClient,
    upstream: Upstream,
    api: str,
    fault: Status,
    said: str,
    attempts: int,
) -> None:
    sid = await seeded(client, 12)
    upstream.script([fault] * 3 + [Reply(SUMMARY)] * 3)
    job = await request_compaction(client, sid)

    # Each attempt is recorded at once (no lease waited out), and no more are made.
    started = time.monotonic()
    assert await drain(app, worker_config(upstream, api=api, max_attempts=3)) == attempts
    print(f"\n[upstream] {attempts} attempt(s) in {time.monotonic() - started:.2f} s")

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive", done
    assert done["attempts"] == attempts
    assert len(upstream.requests) == attempts
    notes = done["details"]["notes"]
    assert len(notes) == attempts, notes
    for note in notes:
        assert said in note, note
        assert f"HTTP {fault.code}" in note, note
    # The job's error is the upstream's, not a database error.
    assert done["error"] == "; ".join(notes)
    assert said in done["error"]
    assert "\x00" not in done["error"]
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)
