"""The proxy's context (app.context.assembly.Contexts) is GET /context's, byte for byte,
whether it was read fresh or extended from the last one sent.

Real agent sessions from tests/data/traces are replayed as the proxy replays them (each
call's new messages stored on its connection, then the context built; each reply stored
and added to the context kept), at a window small enough for pruning and compaction to
matter. Between calls, a schedule drawn from a seeded random generator does what else
may happen to a session: usage reports (which may prune), explicit prunes, compactions
committed by the real worker, appends through /v1, config PATCHes, contexts read,
the session deleted and made again under the same id. After every call, the context the
proxy would send is compared with a fresh GET /context read at that moment: same
messages (as bytes: what goes upstream), same system blocks, version and token count.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.context.assembly import Built, Contexts
from app.context.service import ContextService
from app.core.database import driver_connection
from app.core.tenancy import DEFAULT_TENANT
from app.engine.proxy.wire import Api
from app.messages.schemas import AppendRequest
from app.messages.service import AppendService
from app.proxy.repository import ProxyRepository
from tests import traces
from tests.compactions.helpers import drain
from tests.helpers import get_session, history

WINDOW = {"model": "gpt-4o", "context_window": 16_000, "max_output_tokens": 2_000}
DISTURBANCES = ("usage", "prune", "compact", "foreign", "patch", "read", "recreate")


def plain(message: dict[str, Any]) -> dict[str, Any]:
    """A trace message as an agent sends it (the traces keep their harness's records)."""
    keep = ("role", "content", "tool_call_id", "tool_calls", "name")
    out = {k: message[k] for k in keep if message.get(k) is not None}
    if "tool_calls" in out:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": dict(c["function"])}
            for c in out["tool_calls"]
        ]
    return out


class Replay:
    """One session replayed as the proxy would, with a :class:`Contexts` of its own."""

    def __init__(self, app: Any, client: httpx.AsyncClient, sid: str, api: Api) -> None:
        self.app, self.client, self.sid, self.api = app, client, sid, api
        self.engine = app.state.engine
        self.contexts = Contexts()
        self.repo = ProxyRepository(DEFAULT_TENANT)
        self.extended = self.fresh = 0
        self.last: Built | None = None
        self.compacted = self.pruned = 0  # disturbances that moved the window

    async def create(self, config: dict[str, Any]) -> None:
        r = await self.client.post("/v1/sessions", json={"id": self.sid, **WINDOW, **config})
        assert r.status_code == 201, r.text

    async def call(self, messages: list[dict[str, Any]], where: str) -> None:
        """A proxied call's new messages stored, and the context it would send checked
        against a fresh read."""
        async with driver_connection(self.engine) as driver:
            row = await self.repo.known(driver, self.sid)
            assert row is not None
            appended = await AppendService(self.engine, DEFAULT_TENANT).store(
                self.sid,
                AppendRequest(messages=messages, format="openai"),
                idempotency_key=None,
                if_match=str(row.version),
                driver=driver,
            )
            built = await self.contexts.after_append(
                driver, DEFAULT_TENANT, self.sid, self.api, row.created_at, appended
            )
        fresh = orjson.loads(
            await ContextService(self.engine, DEFAULT_TENANT).build(self.sid, self.api)
        )
        assert built.messages == orjson.dumps(fresh["messages"]), where
        system = None if built.system is None else orjson.loads(built.system)
        assert system == fresh["system"], where
        assert built.version == fresh["version"], where
        breakdown = fresh["tokens"]["breakdown"]
        counted = breakdown["summary"] + breakdown["messages"] + breakdown["tool_outputs"]
        assert built.tokens == counted, where
        self.extended += built.extended
        self.fresh += not built.extended
        self.last = built

    async def reply(self, message: dict[str, Any]) -> None:
        """A reply stored as the proxy stores it, and added to the context kept."""
        async with driver_connection(self.engine) as driver:
            row = await self.repo.known(driver, self.sid)
            assert row is not None
            appended = await AppendService(self.engine, DEFAULT_TENANT).store(
                self.sid,
                AppendRequest(messages=[message], format="openai"),
                idempotency_key=None,
                if_match=str(row.version),
                driver=driver,
            )
        self.contexts.extend(DEFAULT_TENANT, self.sid, self.api, appended)

    async def disturb(self, what: str, rng: random.Random) -> None:
        sid, client = self.sid, self.client
        if what == "usage" and self.last is not None:
            # A prompt as large as the context, or far larger (which may prune).
            prompt = self.last.tokens * rng.choice((1, 3))
            r = await client.post(
                f"/v1/sessions/{sid}/usage",
                json={
                    "input_tokens": prompt,
                    "output_tokens": 20,
                    "context_version": self.last.version,
                },
            )
            assert r.status_code == 200, r.text
        elif what == "prune":
            protect = {"protect_tokens": rng.choice((500, 2000)), "protect_turns": 0}
            r = await client.post(
                f"/v1/sessions/{sid}/prune", json={"minimum_tokens": 0, **protect}
            )
            assert r.status_code == 200, r.text
            self.pruned += r.json()["tokens_saved"] > 0
        elif what == "compact":
            before = (await get_session(client, sid))["compaction_count"]
            r = await client.post(f"/v1/sessions/{sid}/compactions", json={})
            assert r.status_code in (202, 409), r.text  # 409: one is queued already
            await drain(self.app)
            self.compacted += (await get_session(client, sid))["compaction_count"] > before
        elif what == "foreign":
            r = await client.post(
                f"/v1/sessions/{sid}/messages",
                json={"messages": [{"role": "user", "content": f"A note ({rng.random():.6f})."}]},
            )
            assert r.status_code == 201, r.text
        elif what == "patch":
            config = {"prune": {"placeholder": f"[output cleared {rng.randrange(1000)}]"}}
            r = await client.patch(f"/v1/sessions/{sid}", json={"config": config})
            assert r.status_code == 200, r.text
        elif what == "read":
            r = await client.get(f"/v1/sessions/{sid}/context", params={"format": self.api})
            assert r.status_code == 200, r.text
        elif what == "recreate":
            # The same history under the same id, in a session made again: the proxy's
            # record of it goes with the old one.
            stored = [e["message"] for e in await history(client, sid) if e["kind"] == "message"]
            r = await client.delete(f"/v1/sessions/{sid}")
            assert r.status_code == 204, r.text
            await self.create({})
            r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": stored})
            assert r.status_code == 201, r.text


async def replay(
    app: Any, client: httpx.AsyncClient, path: Path, api: Api, seed: int
) -> tuple[Replay, list[tuple[str, bool | None]]]:
    """The trace replayed; what was done, in order (a call with whether its context
    was extended)."""
    rng = random.Random(seed)
    messages = [plain(m) for m in traces.load(path)]
    if messages[0]["role"] == "system":
        messages = messages[1:]  # the proxy's system prompt: overhead, never stored
    sid = f"cache-{seed}-{api}-{path.name.split('.')[0].replace('__', '-')}"[:128]
    session = Replay(app, client, sid, api)
    await session.create({"config": {"compaction": {"auto_continue": rng.random() < 0.5}}})
    done: list[tuple[str, bool | None]] = []
    bag: list[str] = []  # every kind of disturbance comes before any comes again
    pending: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            await session.call(pending, f"seed {seed}, message {i}, after {done[-8:]}")
            assert session.last is not None
            done.append(("call", session.last.extended))
            pending = []
        await session.reply(message)
        done.append(("reply", None))
        if rng.random() < 0.4:
            if not bag:
                bag = rng.sample(DISTURBANCES, len(DISTURBANCES))
            what = bag.pop()
            await session.disturb(what, rng)
            done.append((what, None))
    return session, done


@pytest.mark.parametrize(("api", "seed"), [("openai", 1), ("anthropic", 2), ("openai", 3)])
async def test_the_context_sent_is_a_fresh_read_s_whatever_happens_between_calls(
    app: Any, client: httpx.AsyncClient, api: Api, seed: int
) -> None:
    files = sorted(traces.trace_files(), key=lambda p: len(traces.load(p)))
    session, done = await replay(app, client, files[seed], api, seed)
    kinds = {what for what, _ in done}
    assert set(DISTURBANCES) <= kinds, done
    # Most calls extend the last context; a call after the session moved by more than
    # the proxy's own writes (an append through /v1, a PATCH, the session made again)
    # reads it fresh.
    assert session.extended > session.fresh > 0, (session.extended, session.fresh)
    assert session.compacted, done
    assert session.pruned, done
    for k, (what, _) in enumerate(done):
        if what in ("foreign", "patch", "recreate"):
            following = [extended for w, extended in done[k:] if w == "call"]
            assert not following or following[0] is False, done[k:]


async def test_a_session_deleted_and_made_again_alike_is_read_fresh(
    app: Any, client: httpx.AsyncClient
) -> None:
    """Made again with the same config and as many entries, nothing pruned or compacted:
    only the session's creation tells it from the one the proxy kept a context of."""
    session = Replay(app, client, "cache-again", "openai")
    await session.create({})
    await session.call([{"role": "user", "content": "List the files."}], "first")
    await session.reply({"role": "assistant", "content": "There are three."})
    await session.call([{"role": "user", "content": "Which is largest?"}], "second")
    assert session.last is not None
    assert session.last.extended
    r = await client.delete("/v1/sessions/cache-again")
    assert r.status_code == 204, r.text
    await session.create({})
    r = await client.post(
        "/v1/sessions/cache-again/messages",
        json={
            "messages": [
                {"role": "user", "content": "Delete the files."},
                {"role": "assistant", "content": "All three are gone."},
                {"role": "user", "content": "Which was largest?"},
            ]
        },
    )
    assert r.status_code == 201, r.text
    await session.reply({"role": "assistant", "content": "setup.py was."})
    await session.call([{"role": "user", "content": "Thanks."}], "after it was made again")
    assert not session.last.extended
