"""The proxy follows the active path: after a navigation (through the API) the agent
sends the new path's history, plus its new message, and the proxy matches it against
that path, not the one it left; a fork is proxied on its own."""

from __future__ import annotations

from typing import Any

from app.core.settings import Settings
from tests.proxy.support import api, openai_client, proxy, settled, stored_history
from tests.upstream_server import Reply, Upstream

SYSTEM: Any = {"role": "system", "content": "You are a careful assistant."}


async def test_a_navigated_session_is_proxied_along_its_new_path(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([Reply("A."), Reply("B."), Reply("C."), Reply("D.")])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "nav") as client, api(base) as http:
            history: list[Any] = [{"role": "user", "content": "First question?"}]
            first = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *history]
            )
            history.append(first.choices[0].message.model_dump(exclude_unset=True))
            history.append({"role": "user", "content": "Second question?"})
            second = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *history]
            )
            assert second.choices[0].message.content == "B."
            # The proxy stores a reply once it is delivered: wait for it.
            assert (await settled(http, "nav", 4))["entry_count"] == 4
            # Back to the first answer (the system prompt goes upstream as the agent sends
            # it, not into the history: the user's question is seq 1, the answer seq 2).
            r = await http.post("/v1/sessions/nav/navigate", json={"seq": 2})
            assert r.status_code == 200, r.text
            branch = [*history[:2], {"role": "user", "content": "Another question?"}]
            third = await client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, *branch])
            assert third.choices[0].message.content == "C."
            # Upstream got the new path, not the abandoned question.
            sent = upstream.requests[-1].json["messages"]
            assert [m.get("content") for m in sent] == [
                SYSTEM["content"],
                "First question?",
                "A.",
                "Another question?",
            ]
            assert (await settled(http, "nav", 4))["entry_count"] == 4
            stored = await stored_history(http, "nav", "openai")
            assert [m.get("content") for m in stored] == [
                "First question?",
                "A.",
                "Another question?",
                "C.",
            ]
            # A fork of it is proxied on its own path.
            r = await http.post("/v1/sessions/nav/fork", json={"id": "nav-fork", "at_seq": 2})
            assert r.status_code == 201, r.text
        async with openai_client(base, "nav-fork") as forked, api(base) as http:
            fork_history = [*history[:2], {"role": "user", "content": "Fork question?"}]
            fourth = await forked.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *fork_history]
            )
            assert fourth.choices[0].message.content == "D."
            assert (await settled(http, "nav-fork", 4))["entry_count"] == 4
            assert [m.get("content") for m in await stored_history(http, "nav-fork", "openai")] == [
                "First question?",
                "A.",
                "Fork question?",
                "D.",
            ]
            assert len(await stored_history(http, "nav", "openai")) == 4
