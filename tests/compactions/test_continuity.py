"""The task survives compaction, through the real worker (issue 14): the committed
context quotes the first request verbatim however many compactions follow, the
latest requests with it, within their budget; pinned messages stay in the
context, whole; the service's "continue" is never taken for the user's words;
and a summary that makes the context larger is still not committed."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.compactions.helpers import compaction, conversation, drain, worker_config
from tests.compactions.worker_support import SHORT, SUMMARY, prompt_of
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history
from tests.upstream_server import Reply, Upstream

FIRST = "Fix the failing date parser in src/dates.py. Never edit tests/."
CONTINUE = "Continue if you have next steps."
MANUAL = {
    "compaction": {"auto": False, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def compact(app: Any, client: httpx.AsyncClient, sid: str, **config: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app, worker_config(**config)) == 1
    return await compaction(client, sid, r.json()["id"])


def renamed(batches: list[list[dict[str, Any]]], prefix: str) -> list[list[dict[str, Any]]]:
    """The batches with their call ids made unique to one round."""
    for batch in batches:
        for m in batch:
            for call in m.get("tool_calls") or []:
                call["id"] = prefix + call["id"]
            if m.get("tool_call_id"):
                m["tool_call_id"] = prefix + m["tool_call_id"]
    return batches


def quoted(text: str) -> list[tuple[int, str]]:
    """(seq, text) of the requests a summary's ``<user-requests>`` block quotes."""
    block = re.search(r"<user-requests>\n.*?</user-requests>", text, re.S)
    assert block is not None, text[-500:]
    return [
        (int(m[1]), m[2])
        for m in re.finditer(r'<request seq="(\d+)"[^>]*>\n(.*?)\n</request>', block[0], re.S)
    ]


def summary_message(ctx: dict[str, Any]) -> str:
    for m in ctx["messages"]:
        content = m["content"]
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content)
        if "<user-requests>" in content:
            return str(content)
    raise AssertionError("no summary in the context")


def assert_valid(ctx: dict[str, Any], fmt: str) -> None:
    from app.engine.window.context import check_anthropic_pairing, check_openai_pairing

    check = check_openai_pairing if fmt == "openai" else check_anthropic_pairing
    assert check(ctx["messages"]) == []
    assert ctx["tokens"]["estimated"] <= ctx["tokens"]["budget"]


async def test_every_committed_context_quotes_the_first_request_verbatim(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="c", config=MANUAL)
    for batch in conversation(24):
        await append_ok(client, "c", batch)
    for round_ in range(4):
        if round_:
            text = f"Round {round_}: now handle `week_{round_}` in src/weeks.py."
            more = [[{"role": "user", "content": text}], *conversation(16)[1:]]
            for batch in renamed(more, f"r{round_}"):
                await append_ok(client, "c", batch)
        done = await compact(app, client, "c")
        assert done["status"] == "succeeded", done
        assert done["summarizer_used"] == "extractive"
        assert done["tokens_after"] < done["tokens_before"]
        stored = await history(client, "c")
        users = [
            (e["seq"], e["message"]["content"])
            for e in stored
            if e["kind"] == "message" and e["role"] == "user"
        ]
        first_seq = users[0][0]
        assert users[0] == (first_seq, FIRST)
        summarized = [u for u in users[1:] if u[0] < done["first_kept_seq"]]
        for fmt in ("openai", "anthropic"):
            ctx = await context(client, "c", fmt)
            assert_valid(ctx, fmt)
            text = summary_message(ctx)
            requests = quoted(text)
            # The first request, whole and first, after any number of compactions.
            assert requests[0] == (first_seq, FIRST)
            assert f'<request seq="{first_seq}" first="true">\n{FIRST}\n</request>' in text
            # Then the latest ones summarized, oldest first, each as the user wrote it.
            later = requests[1:]
            assert later
            assert later == summarized[len(summarized) - len(later) :]
        first = done["details"]["user_requests"]["first"]
        assert first == {"seq": first_seq, "text": FIRST, "clipped": False, "pinned": False}
        kept = done["details"]["user_requests"]
        assert 0 < kept["tokens"] <= kept["budget_tokens"]
    assert (await get_session(client, "c"))["compaction_count"] == 4


SMALL = {"context_window": 16_000, "max_output_tokens": 2_000}
AUTO = {
    "compaction": {"reserve_tokens": 4_000, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}


async def test_an_llm_summary_quotes_the_requests_and_never_reads_the_continue(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """An automatic compaction leaves the service's "continue"; the next one, by
    a model, is never shown it as the user's, and quotes only what the user wrote."""
    await make_session(client, id="l", **SMALL, config=AUTO)
    batches = conversation(40, words=300)
    n = 0
    for n, batch in enumerate(batches):  # noqa: B007 - the batch the threshold came at
        body = await append_ok(client, "l", batch)
        if body["compaction"]:
            break
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    assert await drain(app, worker_config(upstream)) == 1
    first_job = await compaction(client, "l", body["compaction"]["id"])
    assert first_job["details"]["continued"] is True
    assert [e["kind"] for e in (await history(client, "l"))[-2:]] == ["compaction", "continue"]

    # The agent goes on; a second compaction summarizes the "continue" with the rest.
    ask = "Also support ISO week dates like 2024-W05-3."
    steps = [b for b in batches[n + 1 : n + 12] if b[0]["role"] != "user"]
    await append_ok(client, "l", [{"role": "user", "content": ask}])
    for batch in renamed(steps, "x"):
        await append_ok(client, "l", batch)
    await append_ok(client, "l", [{"role": "user", "content": "And the time zones."}])
    for batch in renamed(conversation(4)[1:], "y"):
        await append_ok(client, "l", batch)
    stored = await history(client, "l")
    continue_seq = next(e["seq"] for e in stored if e["kind"] == "continue")
    ask_seq = next(e["seq"] for e in stored if e["message"].get("content") == ask)
    r = await client.post("/v1/sessions/l/compactions", json={})
    assert r.status_code == 202, r.text
    sent = len(upstream.requests)
    upstream.script([Reply(SUMMARY), Reply(SUMMARY), Reply(SHORT)])
    assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, "l", r.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert continue_seq < ask_seq < done["first_kept_seq"]
    # Every prompt of this compaction: the user's words, never the service's.
    prompts = [prompt_of(request) for request in upstream.requests[sent:]]
    transcripts = "".join(p.split("<conversation>\n", 1)[-1] for p in prompts)
    assert f"[User]: {ask}" in transcripts
    assert CONTINUE not in transcripts
    # The block ends the summary: the first request, then the latest, never the prompt.
    assert done["summary"].startswith(SUMMARY)
    assert done["summary"].endswith("</user-requests>")
    requests = quoted(done["summary"])
    assert requests[0][1] == FIRST
    assert all(text != CONTINUE for _, text in requests)
    assert (ask_seq, ask) in requests
    # Within a tenth of this small window's threshold.
    details = done["details"]["user_requests"]
    assert details["budget_tokens"] < 2_000
    assert details["tokens"] <= details["budget_tokens"]
    for fmt in ("openai", "anthropic"):
        assert_valid(await context(client, "l", fmt), fmt)


async def test_a_pinned_message_stays_whole_in_the_compacted_context(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="p", config=MANUAL)
    batches = conversation(24)
    rule = "Always keep the public API of src/dates.py unchanged."
    note = "Understood: the public API stays as it is."
    batches.insert(3, [{"role": "user", "content": rule, "pinned": True}])
    batches.insert(4, [{"role": "assistant", "content": note, "pinned": True}])
    for batch in batches:
        await append_ok(client, "p", batch)
    stored = await history(client, "p")
    seqs = {e["message"]["content"]: e["seq"] for e in stored}
    done = await compact(app, client, "p")
    assert done["status"] == "succeeded", done
    assert seqs[note] < done["first_kept_seq"]
    assert done["details"]["pinned_entries"] == 3  # the system prompt and the two
    # Kept, not summarized, nor quoted among the requests.
    r = await client.get(f"/v1/sessions/p/compactions/{done['id']}/source", params={"limit": 1000})
    assert r.status_code == 200, r.text
    replaced = [e["seq"] for e in r.json()["entries"]]
    assert seqs[rule] not in replaced
    assert seqs[note] not in replaced
    assert all(text not in (rule, note) for _, text in quoted(done["summary"]))
    openai = await context(client, "p")
    assert_valid(openai, "openai")
    assert openai["messages"][:3] == [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": rule},
        {"role": "assistant", "content": note},
    ]
    assert "compacted" in openai["messages"][3]["content"]
    anthropic = await context(client, "p", "anthropic")
    assert_valid(anthropic, "anthropic")
    assert anthropic["messages"][0]["content"] == [{"type": "text", "text": rule}]
    assert anthropic["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": note}],
    }
    # The counts: the session's context is what the context read sends.
    session = await get_session(client, "p")
    b = openai["tokens"]["breakdown"]
    assert b["summary"] + b["messages"] + b["tool_outputs"] == session["context_tokens"]
    # The history still holds everything as it was sent.
    assert [e["message"] for e in (await history(client, "p"))[: len(stored)]] == [
        e["message"] for e in stored
    ]


async def test_a_summary_quoting_a_long_request_it_barely_replaces_is_not_committed(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The block counts: when what is summarized is mostly the request it quotes
    whole, the summary would make the context larger, and nothing is committed."""
    await make_session(client, id="n", config={"compaction": {"keep_recent_tokens": 10}})
    request = "Implement the parser described here. " + "It must accept `YYYY-Www-D`. " * 200
    await append_ok(
        client,
        "n",
        [
            {"role": "user", "content": request},
            {"role": "assistant", "content": "On it."},
            {"role": "user", "content": "Go."},
        ],
    )
    before = await get_session(client, "n")
    done = await compact(app, client, "n")
    assert done["status"] == "cancelled", done
    assert "not committed" in done["error"]
    after = await get_session(client, "n")
    for key in ("entry_count", "context_tokens", "compaction_count", "version"):
        assert after[key] == before[key], key
