"""The Python client (clients/python) against a real compactd over HTTP: every method
of both clients, the answers they type, the problems they raise, and the API key.

One scenario drives every method; it runs once with :class:`AsyncCompactd` and once
with :class:`Compactd` (each call of which is wrapped in a coroutine, see
:class:`Awaited`). Each run records the requests its client sent and checks that
they reached every operation of the API but the proxy's.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import asyncpg
import httpx
import pytest
from compactd_client import (
    AsyncCompactd,
    Compactd,
    CompactdConnectionError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PreconditionFailedError,
    ProblemError,
)
from openai.types import CompletionUsage
from openai.types.completion_usage import PromptTokensDetails

from app.cli import _openapi_document
from app.core.settings import Settings
from app.keys import repository
from app.main import create_app
from tests import postgres
from tests.client.streams import close, take_until
from tests.e2e.server import free_port, running
from tests.upstream_server import Hang, Upstream

# Nothing automatic: every prune and compaction in the scenario is asked for.
MANUAL = {
    "compaction": {"auto": False, "keep_recent_tokens": 10},
    "prune": {"auto": False, "protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 1},
}
FILE = "".join(f"def handler_{i}(request):\n    return respond(request, {i})\n" for i in range(120))
# A long answer: what a compaction summarizes (pruning takes the tool outputs).
ANSWER = " ".join(f"Handler {i} validates its request, then calls respond." for i in range(60))


def turn(n: int) -> list[dict[str, Any]]:
    """A user asks, the assistant reads a file with a tool, then answers."""
    call = f"call_{n}"
    return [
        {"role": "user", "content": f"What does module_{n}.py do?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{n}"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": FILE},
        {"role": "assistant", "content": f"module_{n}.py defines 120 request handlers. " + ANSWER},
    ]


CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    *turn(1),
    *turn(2),
    *turn(3),
    {"role": "user", "content": "Which module should I refactor first?"},
]


class Awaited:
    """The sync client's methods as coroutines, so one scenario drives both clients:
    each call runs the sync method as it is (blocking this test's loop, which serves
    nothing; compactd runs in its own thread)."""

    def __init__(self, client: Compactd) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


def operations() -> set[tuple[str, str]]:
    """The API's operations (method, path template), as the app documents them now,
    but the proxy's (the provider SDKs call those)."""
    spec = json.loads(_openapi_document())
    return {
        (method.upper(), route)
        for route, item in spec["paths"].items()
        for method in item
        if not route.startswith("/proxy/")
    }


def reached(sent: list[httpx.Request]) -> set[tuple[str, str]]:
    """The operations ``sent`` reached: each request's path matched to a template."""
    templates = [
        (method, route, re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", route) + "$"))
        for method, route in operations()
    ]
    return {
        (method, route)
        for request in sent
        for method, route, pattern in templates
        if request.method == method and pattern.match(request.url.path)
    }


async def scenario(api: AsyncCompactd, upstream: Upstream, name: str) -> None:
    """Every method once at least, each answer checked against what was asked."""
    assert (await api.healthz())["status"] == "ok"
    assert (await api.readyz())["status"] == "ready"
    assert "compactd_http_requests" in await api.metrics()

    created = await api.create_session(
        "gpt-4o", id=name, config=MANUAL, metadata={"suite": name, "step": "created"}
    )
    sid = created["id"]
    assert sid == name
    assert created["entry_count"] == 0
    assert created["config"]["compaction"]["auto"] is False
    assert (await api.get_session(sid))["metadata"] == {"suite": name, "step": "created"}
    other = await api.create_session("claude-sonnet-4-5", metadata={"suite": name})
    page = await api.list_sessions(metadata={"suite": name, "step": "created"})
    assert [s["id"] for s in page["sessions"]] == [sid]
    first = await api.list_sessions(limit=1, metadata={"suite": name})
    assert first["next_cursor"] is not None
    rest = await api.list_sessions(cursor=first["next_cursor"], metadata={"suite": name})
    assert {s["id"] for s in first["sessions"] + rest["sessions"]} == {sid, other["id"]}

    # An Anthropic request as the agent has it: its system prompt and tools beside.
    tools = [{"name": "read_file", "input_schema": {"type": "object", "properties": {}}}]
    await api.append_messages(
        other["id"],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        format="anthropic",
        system="Be brief.",
        tools=tools,
    )
    assert (await api.get_session(other["id"]))["overhead_tokens"] > 0
    other_context = await api.get_context(other["id"], format="anthropic")
    assert other_context["system"] == [{"type": "text", "text": "Be brief."}]

    patched = await api.update_session(
        sid, {"metadata": {"suite": name, "step": "patched"}}, if_match=created["version"]
    )
    assert patched["metadata"]["step"] == "patched"

    appended = await api.append_messages(sid, CONVERSATION, if_match=patched["version"])
    assert [e["role"] for e in appended["entries"]] == [m["role"] for m in CONVERSATION]
    assert appended["overflow"]["action"] == "none"
    head = await api.list_messages(sid, limit=3)
    assert [e["message"] for e in head["entries"]] == CONVERSATION[:3]
    assert head["next_after_seq"] is not None
    tail = await api.list_messages(sid, after_seq=head["next_after_seq"], format="anthropic")
    assert len(head["entries"]) + len(tail["entries"]) == len(CONVERSATION)
    assert tail["entries"][0]["message"]["content"][0]["type"] == "tool_result"

    context = await api.get_context(sid)
    assert context["messages"] == CONVERSATION
    assert context["state"] == "ok"
    anthropic = await api.get_context(sid, format="anthropic")
    assert anthropic["system"] is not None
    assert anthropic["system"][0]["text"] == "You are a coding agent."
    verdict = await api.get_overflow(sid)
    assert verdict["usable_tokens"] == created["usable_tokens"]

    prompt = context["tokens"]["estimated"] + 40
    usage = await api.report_usage(
        sid,
        {"input_tokens": prompt, "output_tokens": 30},
        context_version=context["version"],
        finish_reason="stop",
    )
    assert usage["reported_prompt_tokens"] == prompt
    assert usage["usage_format"] == "native"
    # The SDK's own usage object, as the model call returned it.
    sdk_usage = CompletionUsage(
        prompt_tokens=prompt + 60,
        completion_tokens=25,
        total_tokens=prompt + 85,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=prompt),
    )
    native = await api.report_usage(sid, sdk_usage, finish_reason="tool_calls", format="openai")
    assert native["usage_format"] == "openai_chat"
    assert native["reported_prompt_tokens"] == prompt + 60
    anthropic_usage = {"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": prompt}
    from_dict = await api.report_usage(sid, anthropic_usage, finish_reason="end_turn")
    assert from_dict["usage_format"] == "anthropic"
    assert from_dict["reported_prompt_tokens"] == prompt + 50
    # format goes as ?format=, checked by the server: a bad one is refused there.
    with pytest.raises(ProblemError) as bad_format:
        await api.report_usage(sid, anthropic_usage, format=cast(Any, "gemini"))
    assert bad_format.value.status == 422
    after = await api.get_session(sid)
    assert after["usage_count"] == 3
    assert after["last_usage"] is not None
    assert after["last_usage"]["finish_reason"] == "end_turn"

    dry = await api.prune(sid, dry_run=True)
    assert dry["dry_run"] is True
    assert {p["tool_name"] for p in dry["pruned"]} == {"read_file"}
    pruned = await api.prune(sid, protect_turns=1)
    assert pruned["tokens_saved"] > 0
    assert [p["seq"] for p in pruned["pruned"]] == [p["seq"] for p in dry["pruned"]]

    refused = await api.report_provider_error(
        other["id"], "prompt is too long: 208310 tokens > 200000 maximum", status=400
    )
    assert refused["overflow"] is True
    assert refused["provider"] == "anthropic"
    assert refused["limit_tokens"] == 200_000

    job = await api.request_compaction(sid, summarizer="extractive", wait=60)
    assert job["status"] == "succeeded", job
    assert job["summarizer_used"] == "extractive"
    assert (await api.get_compaction(sid, job["id"]))["summary"] == job["summary"]
    listed = await api.list_compactions(sid, limit=5)
    assert [c["id"] for c in listed["compactions"]] == [job["id"]]
    # What it saved is the session's and the tenant's; an extractive summary cost nothing.
    tokens_before, tokens_after = job["tokens_before"], job["tokens_after"]
    assert tokens_before is not None
    assert tokens_after is not None
    saved = tokens_before - tokens_after
    assert (await api.get_session(sid))["compaction_saved_tokens"] == saved
    tenant_usage = await api.get_usage()
    assert tenant_usage["compactions"] >= 1
    assert tenant_usage["saved_tokens"] >= saved
    source = await api.compaction_source(sid, job["id"], limit=1000)
    assert source["entries"]
    assert source["entries"][0]["message"] == CONVERSATION[1]
    paged = await api.compaction_source(sid, job["id"], after_seq=0, limit=1, format="anthropic")
    assert len(paged["entries"]) == 1

    # Recall (tests/client/test_recall.py has more): the history the compaction replaced,
    # searched; the agent's recall tools; and a model's call of one, run for it.
    asked = await api.search(
        sid, "module_2.py", role=["user"], kind=["message"], compaction=job["id"], to_seq=9
    )
    assert [(h["seq"], h["compacted"]) for h in asked["hits"]] == [(6, True)]
    assert "«module_2.py»" in asked["hits"][0]["snippet"]
    outputs = await api.search(sid, "handler_7", tool=["read_file"], from_seq=2, limit=2)
    assert outputs["next_cursor"] is not None
    rest_of = await api.search(
        sid, "handler_7", tool=["read_file"], from_seq=2, limit=2, cursor=outputs["next_cursor"]
    )
    found = outputs["hits"] + rest_of["hits"]
    assert sorted(h["seq"] for h in found) == [4, 8, 12]
    assert {h["tool_name"] for h in found} == {"read_file"}
    openai_tools = await api.get_tools()
    assert [t["function"]["name"] for t in openai_tools["tools"]] == [
        "history_search",
        "history_read",
    ]
    anthropic_tools = await api.get_tools(format="anthropic")
    assert [t["name"] for t in anthropic_tools["tools"]] == ["history_search", "history_read"]
    read = await api.run_tool_call(
        sid,
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "history_read",
            "input": {"from_seq": 6, "to_seq": 6},
        },
        max_tokens=1000,
    )
    assert read["content"] == "[seq 6] user: What does module_2.py do?"
    assert (read["format"], read["is_error"], read["truncated"]) == ("anthropic", False, False)
    assert read["message"] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": read["content"],
    }

    # Events and webhooks (tests/client/test_events.py and test_webhooks.py have more):
    # the compaction above in the session's stream and in the tenant's; a webhook made,
    # read, tested, paused and deleted.
    stream = await api.events(sid)
    try:
        logged = await take_until(stream, lambda e: e["type"] == "compaction.succeeded")
    finally:
        await close(stream)
    assert logged[-1]["data"]["compaction_id"] == job["id"]
    tenant = await api.tenant_events(types=["compaction.succeeded"], after=logged[0]["id"])
    try:
        succeeded = await take_until(tenant, lambda e: e["session_id"] == sid)
    finally:
        await close(tenant)
    assert succeeded[-1] == logged[-1]
    assert {e["type"] for e in succeeded} == {"compaction.succeeded"}
    nowhere = f"http://127.0.0.1:{free_port()}/compactd"
    webhook = await api.create_webhook(nowhere, types=["compaction.*"], description=name)
    assert webhook["secret"].startswith("whsec_")
    assert (await api.get_webhook(webhook["id"]))["description"] == name
    assert [w["id"] for w in (await api.list_webhooks())["webhooks"]] == [webhook["id"]]
    tested = await api.test_webhook(webhook["id"])
    deliveries = await api.list_deliveries(webhook["id"], limit=5)
    assert [d["id"] for d in deliveries["deliveries"]] == [tested["id"]]
    assert (await api.update_webhook(webhook["id"], enabled=False))["enabled"] is False
    await api.delete_webhook(webhook["id"])
    assert (await api.list_webhooks())["webhooks"] == []

    # A compaction that waits on a summarizer that does not answer, cancelled meanwhile.
    upstream.script([Hang(20)])
    await api.append_messages(sid, turn(4))
    slow = await api.request_compaction(sid, summarizer="llm", instructions="Focus on module 4.")
    assert slow["status"] in ("queued", "running")
    cancelled = await api.cancel_compaction(sid, slow["id"])
    assert cancelled["id"] == slow["id"]
    assert cancelled["cancel_requested"] is True

    # The tree (tests/client/test_tree.py has more): back to the first request, a new
    # branch from there, the tree a page at a time, and a fork of the new branch.
    branched = await api.create_session("gpt-4o", config=MANUAL)
    grown = await api.append_messages(branched["id"], turn(5))
    back = await api.navigate(branched["id"], seq=1, if_match=grown["version"])
    assert (back["status"], back["leaf_seq"], back["abandoned_seqs"]) == ("moved", 1, 3)
    assert back["leaf_id"] == grown["entries"][0]["id"]
    anew = await api.append_messages(branched["id"], [{"role": "user", "content": "Skip it."}])
    assert [e["seq"] for e in anew["entries"]] == [2]
    top = await api.get_tree(branched["id"], limit=4)
    assert top["next_cursor"] is not None
    end = await api.get_tree(branched["id"], cursor=top["next_cursor"])
    assert end["next_cursor"] is None
    assert [e["id"] for e in top["entries"] + end["entries"] if e["on_path"]] == [
        grown["entries"][0]["id"],
        anew["entries"][0]["id"],
    ]
    forked = await api.fork(branched["id"], metadata={"suite": name, "step": "forked"})
    assert forked["entry_count"] == 2
    assert forked["metadata"] == {"suite": name, "step": "forked"}
    assert (await api.get_context(forked["id"]))["messages"] == [
        turn(5)[0],
        {"role": "user", "content": "Skip it."},
    ]

    await api.delete_session(other["id"])
    with pytest.raises(NotFoundError):
        await api.get_session(other["id"])


async def test_the_async_client_covers_every_operation(
    compactd_url: str, upstream: Upstream
) -> None:
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    async with (
        httpx.AsyncClient(timeout=90, event_hooks={"request": [record]}) as http,
        AsyncCompactd(compactd_url, http_client=http) as api,
    ):
        await scenario(api, upstream, "async-client")
    assert reached(sent) == operations()


async def test_the_sync_client_covers_every_operation(
    compactd_url: str, upstream: Upstream
) -> None:
    sent: list[httpx.Request] = []
    with (
        httpx.Client(timeout=90, event_hooks={"request": [sent.append]}) as http,
        Compactd(compactd_url, http_client=http) as api,
    ):
        await scenario(cast(AsyncCompactd, Awaited(api)), upstream, "sync-client")
    assert reached(sent) == operations()


def test_a_compaction_may_wait_longer_than_the_clients_timeout(
    compactd_url: str, upstream: Upstream
) -> None:
    """``wait`` holds the answer until the compaction is done: the request's read
    timeout makes room for it (no retry here: a timeout would be an error)."""
    upstream.script([Hang(2)])  # the summarizer answers after 2 s
    with Compactd(compactd_url) as setup:
        sid = setup.create_session("gpt-4o", config=MANUAL)["id"]
        setup.append_messages(sid, CONVERSATION)
    with Compactd(compactd_url, timeout=1.0, max_retries=0) as api:
        job = api.request_compaction(sid, summarizer="llm", wait=60)
    assert job["status"] == "succeeded", job
    assert job["summarizer_used"] == "llm"


def test_problems_surface_as_typed_errors(compactd_url: str) -> None:
    with Compactd(compactd_url) as api:
        with pytest.raises(NotFoundError) as missing:
            api.get_session("no-such-session")
        assert missing.value.status == 404
        assert missing.value.type.endswith("/not-found")
        assert missing.value.title == "Not found"
        assert "no-such-session" in (missing.value.detail or "")

        with pytest.raises(InvalidRequestError) as invalid:
            api.create_session("gpt-4o", context_window=1000, max_output_tokens=2000)
        assert invalid.value.status == 422
        assert invalid.value.errors, invalid.value.body
        assert all({"field", "detail"} <= set(e) for e in invalid.value.errors)

        api.create_session("gpt-4o", id="taken")
        with pytest.raises(ConflictError) as taken:
            api.create_session("gpt-4o", id="taken")
        assert taken.value.status == 409

        with pytest.raises(PreconditionFailedError) as stale:
            api.append_messages("taken", [{"role": "user", "content": "hi"}], if_match=99)
        assert stale.value.body["current_version"] == 1
        assert api.get_session("taken")["entry_count"] == 0

        with pytest.raises(InvalidRequestError) as bad:
            api.append_messages("taken", [{"role": "wizard", "content": "hi"}])
        assert any("role" in e["field"] for e in bad.value.errors), bad.value.errors
        assert isinstance(bad.value, ProblemError)


async def test_the_async_client_raises_the_same_problems(compactd_url: str) -> None:
    async with AsyncCompactd(compactd_url) as api:
        with pytest.raises(NotFoundError) as missing:
            await api.get_compaction("nobody", "00000000-0000-0000-0000-000000000000")
        assert missing.value.status == 404
        with pytest.raises(InvalidRequestError) as invalid:
            await api.list_messages("nobody", limit=0)
        assert [e["field"] for e in invalid.value.errors] == ["query.limit"]


def test_a_server_that_is_not_there_is_a_connection_error() -> None:
    with (
        Compactd(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.01) as api,
        pytest.raises(CompactdConnectionError) as failed,
    ):
        api.healthz()
    assert isinstance(failed.value.__cause__, httpx.ConnectError)


def test_the_proxy_helpers_name_the_sdks_base_urls_and_the_session_header() -> None:
    api = Compactd("http://compactd.internal:8080/")
    assert api.proxy_base_url("openai") == "http://compactd.internal:8080/proxy/openai/v1"
    assert api.proxy_base_url("anthropic") == "http://compactd.internal:8080/proxy/anthropic"
    assert api.proxy_headers("agent-7") == {"X-Compactd-Session": "agent-7"}
    keyed = Compactd("http://compactd.internal:8080", api_key="cpd_abc")
    assert keyed.proxy_headers("agent-7") == {
        "X-Compactd-Session": "agent-7",
        "X-Compactd-Key": "cpd_abc",
    }
    with pytest.raises(ValueError, match="gemini"):
        api.proxy_base_url("gemini")  # type: ignore[arg-type]


def test_the_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTD_URL", "http://10.0.0.5:9000")
    monkeypatch.setenv("COMPACTD_API_KEY", "cpd_from_env")
    api = Compactd()
    assert api.base_url == "http://10.0.0.5:9000"
    assert api.api_key == "cpd_from_env"
    monkeypatch.delenv("COMPACTD_URL")
    assert Compactd().base_url == "http://127.0.0.1:8080"


@pytest.fixture
def keyed_url(db_url: str, settings: Settings) -> Iterator[tuple[str, str]]:
    """A compactd that has an API key (so it wants one), and that key."""

    async def create_key() -> str:
        conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
        try:
            _, token = await repository.create(conn, "team-a", "client tests")
            return token
        finally:
            await conn.close()

    token = asyncio.run(create_key())
    update = {"auth_cache_seconds": 0.0}
    with running(create_app(settings.model_copy(update=update), database_url=db_url)) as base:
        yield base, token


def test_the_api_key_is_sent_as_a_bearer_token(keyed_url: tuple[str, str]) -> None:
    base, token = keyed_url
    with Compactd(base, api_key=token) as api:
        session = api.create_session("gpt-4o", id="keyed")
        assert api.get_session("keyed")["id"] == session["id"]
    with Compactd(base, api_key="") as anonymous, pytest.raises(ProblemError) as refused:
        anonymous.get_session("keyed")
    assert refused.value.status == 401
