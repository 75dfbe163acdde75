"""GET /v1/sessions/{id}/search: what it finds (stems, identifiers with punctuation,
Unicode), where it looks (every branch of the session's tree, compacted, pruned and
tool outputs included; never another tenant's), its filters, its pages and the input
it refuses."""

from __future__ import annotations

from typing import Any

import httpx

from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem
from tests.ops.conftest import bearer, create_key
from tests.recall.support import MANUAL, every_hit, search
from tests.tree.support import calling, fork_ok, navigate_ok, result, users


def seqs(page: dict[str, Any]) -> list[int]:
    return [h["seq"] for h in page["hits"]]


async def test_stems_find_other_forms_of_a_word(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(
        client,
        "s",
        users(
            "The test failed twice on the CI runner.",
            "Nothing to see here.",
            "Both tests are failing again.",
        ),
    )
    page = await search(client, "s", "failing")
    assert sorted(seqs(page)) == [1, 3]
    assert seqs(page)[0] == 3  # as written beats a stem
    assert page["hits"][0]["score"] >= 4 > page["hits"][1]["score"]
    assert "«failed»" in page["hits"][1]["snippet"]
    assert sorted(seqs(await search(client, "s", "failing tests"))) == [1, 3]
    assert seqs(await search(client, "s", "runners")) == [1]
    assert page["complete"] is True


async def test_identifiers_with_punctuation_rank_where_they_stand_alone_first(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(
        client,
        "s",
        users(
            "call foo.bar_baz() here",  # 1
            "foo.bar_bazooka is another one",  # 2
            "edit a/b/c.py now",  # 3
            "see xa/b/c.pyc too",  # 4
            "run it with --flag set",  # 5
            "run it with --flagged",  # 6
            "def parse_iso_week(value):",  # 7
            "my_parse_iso_week_helper",  # 8
            "parse the iso week",  # 9
            "foo bar baz, as words only",  # 10
        ),
    )
    for query, alone, inside in [
        ("foo.bar_baz", 1, 2),
        ("a/b/c.py", 3, 4),  # no three word characters in a row: read, not indexed
        ("--flag", 5, 6),
        ("parse_iso_week", 7, 8),
    ]:
        hits = (await search(client, "s", query))["hits"]
        assert [h["seq"] for h in hits[:2]] == [alone, inside], (query, hits)
        assert hits[0]["score"] >= 4 > hits[1]["score"] >= 2, (query, hits)
        assert all(h["score"] < 2 for h in hits[2:]), (query, hits)
        assert f"«{query}»" in hits[0]["snippet"], hits[0]
    # The words of an identifier find it, and the identifier its words, below.
    assert 9 in seqs(await search(client, "s", "parse_iso_week"))
    assert 10 in seqs(await search(client, "s", "foo.bar_baz"))
    # Any case; in quotes, as written.
    assert seqs(await search(client, "s", "PARSE_ISO_WEEK"))[:2] == [7, 8]
    assert seqs(await search(client, "s", '"--flag"'))[:2] == [5, 6]


async def test_a_snippet_is_the_matching_line_from_anywhere_in_the_entry(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", config=MANUAL)
    frames = "".join(
        f'  File "/srv/app/lib/mod{i}.py", line {10 + i}, in step{i}\n    step{i + 1}()\n'
        for i in range(12)
    )
    traceback = (
        f"Traceback (most recent call last):\n{frames}"
        '  File "/srv/app/lib/registry.py", line 135, in <module>\n'
        "    register(name)\nKeyError: 'plugin'"
    )
    run = "".join(f"test_case_{i:05d} (tests.test_mod.Case) ... ok\n" for i in range(500))
    run += "----\nRan 501 tests in 3.2s\n\nFAILED (failures=1)"
    assert len(run) > 20_000
    await append_ok(
        client,
        "s",
        [calling("c1"), result("c1", traceback), calling("c2"), result("c2", run)],
    )
    # A place in a file: the frame, as the traceback writes it, not the traceback's top.
    hit = (await search(client, "s", "registry.py line 135"))["hits"][0]
    assert hit["seq"] == 2, hit
    assert hit["score"] >= 4, hit
    assert '"/srv/app/lib/«registry.py", line 135», in <module>' in hit["snippet"]
    assert "Traceback" not in hit["snippet"]
    # By words: the frame with all of them.
    hit = (await search(client, "s", "registry py 135 line"))["hits"][0]
    assert hit["seq"] == 2, hit
    assert hit["score"] < 2, hit
    assert '"/srv/app/lib/«registry».«py»", «line» «135», in <module>' in hit["snippet"]
    # As written: the line of its first place, past the first 8,000 characters too.
    hit = (await search(client, "s", "FAILED (failures=1)"))["hits"][0]
    assert hit["seq"] == 4, hit
    assert hit["score"] >= 4, hit
    assert hit["snippet"] == "…\n----\nRan 501 tests in 3.2s\n\n«FAILED (failures=1)»"
    hit = (await search(client, "s", "failures tests ran"))["hits"][0]
    assert "«Ran» 501 «tests» in 3.2s" in hit["snippet"], hit


async def test_unicode_accents_and_cjk(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(
        client,
        "s",
        users(
            "Le café de l'ÉCOLE est fermé.",  # 1
            "これは日本語のテキストです。",  # 2
            "中文测试, 数据库连接失败",  # 3
            "plain ascii cafe",  # 4
        ),
    )
    assert seqs(await search(client, "s", "école"))[:1] == [1]
    assert seqs(await search(client, "s", "café"))[:1] == [1]
    hits = (await search(client, "s", "日本語"))["hits"]
    assert [h["seq"] for h in hits] == [2]
    assert "«日本語»" in hits[0]["snippet"]
    assert seqs(await search(client, "s", "日本")) == [2]  # two characters: read, not indexed
    assert seqs(await search(client, "s", "连接失败")) == [3]
    assert seqs(await search(client, "s", "fermé"))[:1] == [1]


async def test_nul_is_refused_and_never_stored(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL)
    r = await append(client, "s", [{"role": "user", "content": "before\u0000after"}])
    assert_problem(r, 422, "NUL")
    r = await append(
        client,
        "s",
        [{"role": "assistant", "content": None, "tool_calls": [_call("c", "bash", "x\u0000")]}],
    )
    assert_problem(r, 422, "NUL")
    assert (await client.get("/v1/sessions/s")).json()["entry_count"] == 0
    r = await client.get("/v1/sessions/s/search", params={"q": "a\u0000b"})
    assert_problem(r, 422, "NUL")


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_tool_calls_and_outputs_are_searched_and_filtered_by_tool(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "Find the config loader."},  # 1
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "grep", '{"pattern": "load_settings", "path": "src/"}')],
            },  # 2
            result("c1", "src/config.py:12: def load_settings(path):"),  # 3
            {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [_call("c2", "read_file", '{"path": "src/config.py"}')],
            },  # 4
            result("c2", "def load_settings(path):\n    return toml.load(path)"),  # 5
        ],
    )
    assert sorted(seqs(await search(client, "s", "load_settings"))) == [2, 3, 5]
    assert sorted(seqs(await search(client, "s", "load_settings", tool="grep"))) == [2, 3]
    # The call and the result that answers it: the result's text starts with its call.
    read = await search(client, "s", "src/config.py", tool="read_file")
    assert sorted(seqs(read)) == [4, 5]
    assert "read_file «src/config.py»" in {h["seq"]: h["snippet"] for h in read["hits"]}[5]
    both = await search(client, "s", "load_settings", tool=["grep", "read_file"])
    assert sorted(seqs(both)) == [2, 3, 5]
    tools = {h["seq"]: h["tool_name"] for h in both["hits"]}
    assert tools == {2: None, 3: "grep", 5: "read_file"}
    assert sorted(seqs(await search(client, "s", "load_settings", role="tool"))) == [3, 5]
    assert seqs(await search(client, "s", "read_file", role="assistant")) == [4]


async def test_filters_by_role_kind_and_seq_range(client: httpx.AsyncClient, app: Any) -> None:
    config = {**MANUAL, "compaction": {"auto": False, "keep_recent_tokens": 50}}
    await make_session(client, id="s", config=config)
    await append_ok(client, "s", [{"role": "system", "content": "You guard the widget."}])
    filler = " ".join(f"detail{i}" for i in range(150))
    for k in range(1, 9):
        await append_ok(
            client,
            "s",
            [
                {"role": "user", "content": f"Widget step {k}: tighten the bolts. {filler}"},
                {"role": "assistant", "content": f"Widget step {k} done, bolts tight. {filler}"},
            ],
        )
    r = await client.post("/v1/sessions/s/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = (await client.get(f"/v1/sessions/s/compactions/{r.json()['id']}")).json()
    assert job["status"] == "succeeded", (job["error"], job["details"])

    every = await every_hit(client, "s", "widget")
    assert {h["seq"] for h in every} >= set(range(1, 18))  # the system prompt, 16 messages
    by_role = {h["seq"]: h["role"] for h in every}
    assert set(seqs(await search(client, "s", "widget", role="user", limit=50))) == {
        s for s, role in by_role.items() if role == "user"
    }
    assert set(seqs(await search(client, "s", "widget", role=["system", "assistant"]))) == {
        s for s, role in by_role.items() if role in ("system", "assistant")
    }
    summary = await search(client, "s", "widget", kind="compaction")
    assert seqs(summary) == [job["entry_seq"]]
    assert summary["hits"][0]["compacted"] is False  # the context's summary
    ranged = await every_hit(client, "s", "widget", from_seq=4, to_seq=7)
    assert sorted(h["seq"] for h in ranged) == [4, 5, 6, 7]
    # Compacted: what the summary replaced (the system prompt stays in the context).
    for hit in every:
        replaced = 2 <= hit["seq"] < job["first_kept_seq"]
        assert hit["compacted"] is replaced, hit
        assert hit["on_path"] is True

    # The compaction filter: exactly what its /source lists.
    source = await client.get(f"/v1/sessions/s/compactions/{job['id']}/source")
    listed = sorted(e["seq"] for e in source.json()["entries"])
    assert listed
    replaced = await every_hit(client, "s", "widget", compaction=job["id"])
    assert sorted(h["seq"] for h in replaced) == listed
    narrowed = await every_hit(client, "s", "widget", compaction=job["id"], from_seq=5)
    assert sorted(h["seq"] for h in narrowed) == [s for s in listed if s >= 5]


async def test_pages_follow_the_ranking_without_gaps_or_repeats(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", config=MANUAL)
    texts = [f"retry {k}: the flaky_test failed again" for k in range(12)]
    texts += [f"note {k}: flaky_tests are noisy" for k in range(7)]
    texts += [f"rerun {k}: a flaky test, failing" for k in range(6)]
    await append_ok(client, "s", users(*texts))
    whole = (await search(client, "s", "flaky_test", limit=50))["hits"]
    assert len(whole) == 25
    scores = [h["score"] for h in whole]
    assert scores == sorted(scores, reverse=True)
    for limit in (1, 3, 7, 10):
        paged = await every_hit(client, "s", "flaky_test", limit=limit)
        assert [(h["seq"], h["score"]) for h in paged] == [(h["seq"], h["score"]) for h in whole]
    # Alone first, then inside a longer word, then by words alone.
    assert {h["seq"] for h in whole[:12]} == set(range(1, 13))
    assert {h["seq"] for h in whole[12:19]} == set(range(13, 20))
    # A cursor is bound to its query and filters.
    page = await search(client, "s", "flaky_test", limit=5)
    for other in ({"q": "flaky"}, {"q": "flaky_test", "role": "user"}):
        r = await client.get(
            "/v1/sessions/s/search",
            params={"q": "flaky_test", **other, "cursor": page["next_cursor"], "limit": 5},
        )
        assert_problem(r, 422, "cursor")


async def test_every_branch_of_the_tree_and_no_other_sessions_branches(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="src", config=MANUAL)
    await append_ok(client, "src", users("m1 common", "m2 common", "m3 common", "m4 oldleaf"))
    await navigate_ok(client, "src", seq=2)
    await append_ok(client, "src", users("b3 newbranch common"))
    hits = {h["seq"]: h for h in (await search(client, "src", "common"))["hits"]}
    assert set(hits) == {1, 2, 3}
    assert len((await search(client, "src", "common"))["hits"]) == 4  # seq 3 on both branches
    old = (await search(client, "src", "oldleaf"))["hits"]
    assert [(h["seq"], h["on_path"], h["compacted"]) for h in old] == [(4, False, True)]
    new = (await search(client, "src", "newbranch"))["hits"]
    assert [(h["seq"], h["on_path"], h["compacted"]) for h in new] == [(3, True, False)]

    # A fork searches the path it was forked from, not what its source wrote after.
    await fork_ok(client, "src", id="f", at_seq=2)
    await append_ok(client, "f", users("f3 forkonly"))
    assert seqs(await search(client, "f", "common")) == [2, 1]
    assert seqs(await search(client, "f", "oldleaf")) == []
    assert seqs(await search(client, "f", "forkonly")) == [3]
    assert seqs(await search(client, "src", "forkonly")) == []


async def test_pruned_outputs_are_found_and_erased_ones_are_not(client: httpx.AsyncClient) -> None:
    low = {"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0}
    for sid, erase in (("kept", False), ("erased", True)):
        await make_session(
            client,
            id=sid,
            config={**MANUAL, "prune": {"auto": False, "erase": erase}},
        )
        output = "ERROR: cannot import name 'ImproperlyConfigured'\n" + "x = 1\n" * 300
        await append_ok(client, sid, [calling("c1"), result("c1", output), *users("next")])
        await append_ok(client, sid, [calling("c2"), result("c2", "ok"), *users("done")])
        r = await client.post(f"/v1/sessions/{sid}/prune", json=low)
        assert r.status_code == 200, r.text
        assert [p["seq"] for p in r.json()["pruned"]] == [2]
    assert seqs(await search(client, "kept", "ImproperlyConfigured")) == [2]
    assert seqs(await search(client, "erased", "ImproperlyConfigured")) == []
    # The placeholder is what the erased entry says now.
    assert 2 in seqs(await search(client, "erased", "cleared"))


async def test_another_tenants_session_of_the_same_id_is_never_searched(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    keys = {t: await create_key(db_url, t) for t in ("tenant-a", "tenant-b")}
    for tenant, key in keys.items():
        r = await anon.post(
            "/v1/sessions", json={"id": "same", "model": "gpt-4o"}, headers=bearer(key)
        )
        assert r.status_code == 201, r.text
        r = await anon.post(
            "/v1/sessions/same/messages",
            json={"messages": users(f"shared_secret of {tenant}", f"only {tenant} wrote this")},
            headers=bearer(key),
        )
        assert r.status_code == 201, r.text
    for tenant, key in keys.items():
        page = await search(anon, "same", "shared_secret", headers=bearer(key))
        assert [h["snippet"] for h in page["hits"]] == [f"«shared_secret» of {tenant}"]
        other = "tenant-b" if tenant == "tenant-a" else "tenant-a"
        assert (await search(anon, "same", other, headers=bearer(key)))["hits"] == []
    # A session only the other tenant has is not found at all.
    r = await anon.post(
        "/v1/sessions", json={"id": "b-only", "model": "gpt-4o"}, headers=bearer(keys["tenant-b"])
    )
    assert r.status_code == 201
    r = await anon.get(
        "/v1/sessions/b-only/search", params={"q": "x"}, headers=bearer(keys["tenant-a"])
    )
    assert_problem(r, 404)


async def test_bad_input_is_a_problem_naming_it(client: httpx.AsyncClient) -> None:
    await make_session(
        client, id="s", config={**MANUAL, "compaction": {"auto": False, "keep_recent_tokens": 20}}
    )
    await append_ok(client, "s", users("hello"))
    url = "/v1/sessions/s/search"
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "q"),
        ({"q": ""}, "q"),
        ({"q": "   "}, "q"),
        ({"q": "x" * 501}, "q"),
        ({"q": "x", "limit": 0}, "limit"),
        ({"q": "x", "limit": 51}, "limit"),
        ({"q": "x", "role": "robot"}, "role"),
        ({"q": "x", "kind": "note"}, "kind"),
        ({"q": "x", "from_seq": 0}, "from_seq"),
        ({"q": "x", "from_seq": 5, "to_seq": 4}, "to_seq"),
        ({"q": "x", "cursor": "not-a-cursor"}, "cursor"),
        ({"q": "x", "cursor": "WzEsMiwzXQ"}, "cursor"),
        ({"q": "x", "compaction": "nope"}, "compaction"),
        ({"q": "x", "tool": ""}, "tool"),
        ({"q": "x", "tool": [f"t{i}" for i in range(21)]}, "tool"),
    ]
    for params, named in cases:
        assert_problem(await client.get(url, params=params), 422, named)
    assert (await client.get(url, params={"q": "x" * 500})).status_code == 200
    assert_problem(await client.get("/v1/sessions/nobody/search", params={"q": "x"}), 404)
    missing = "00000000-0000-0000-0000-000000000000"
    r = await client.get(url, params={"q": "x", "compaction": missing})
    assert_problem(r, 404, missing)
    # A compaction that replaced nothing (cancelled while queued) cannot filter.
    await append_ok(client, "s", users(*(f"more {k}" for k in range(6))))
    r = await client.post("/v1/sessions/s/compactions", json={})
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    assert (await client.post(f"/v1/sessions/s/compactions/{cid}/cancel")).status_code == 200
    assert_problem(await client.get(url, params={"q": "x", "compaction": cid}), 409, cid)


async def test_a_query_matching_more_than_a_search_ranks_says_so(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", config=MANUAL)
    for part in range(2):
        await append_ok(
            client, "s", users(*(f"note {part}-{k}: the build is green" for k in range(600)))
        )
    await append_ok(client, "s", users("the build is red"))
    page = await search(client, "s", "build", limit=5)
    assert page["complete"] is False  # 1,201 match; each source ranks 1,000
    assert len(page["hits"]) == 5
    assert page["next_cursor"] is not None
    narrow = await search(client, "s", "red")
    assert narrow["complete"] is True
    assert seqs(narrow) == [1201]
