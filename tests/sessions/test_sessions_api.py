"""Sessions API: create, read, list, patch and delete."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session


async def test_create_with_client_id_uses_catalog_window(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions", json={"model": "gpt-4o", "id": "my-session.1"})
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["id"] == "my-session.1"
    assert r.headers["etag"] == '"1"'
    assert r.headers["location"] == "/v1/sessions/my-session.1"
    assert (s["context_window"], s["max_output_tokens"]) == (128_000, 16_384)
    assert s["model_known"] is True
    assert s["usable_tokens"] == 128_000 - 16_384
    assert s["entry_count"] == 0
    assert s["stored_tokens"] == 0
    assert s["context_tokens"] == 0
    assert s["calibration_factor"] == 1.0
    assert s["compaction_count"] == 0
    assert s["last_usage"] is None
    assert s["version"] == 1


async def test_create_generates_unique_ids(client: httpx.AsyncClient) -> None:
    a = await make_session(client)
    b = await make_session(client)
    assert a["id"]
    assert b["id"]
    assert a["id"] != b["id"]
    assert (await get_session(client, a["id"]))["id"] == a["id"]


async def test_duplicate_id_is_conflict_and_keeps_the_first(client: httpx.AsyncClient) -> None:
    await make_session(client, id="dup", model="gpt-4o")
    r = await client.post("/v1/sessions", json={"id": "dup", "model": "claude-sonnet-4"})
    assert_problem(r, 409, "dup")
    assert (await get_session(client, "dup"))["model"] == "gpt-4o"


async def test_catalog_window_for_known_model(client: httpx.AsyncClient) -> None:
    s = await make_session(client, model="claude-sonnet-4-20250514")
    assert s["model_known"] is True
    assert s["context_window"] == 200_000
    # usable = window - min(max_output, 32000)
    assert s["usable_tokens"] == 200_000 - 32_000


async def test_unknown_model_falls_back_to_128k(client: httpx.AsyncClient) -> None:
    s = await make_session(client, model="acme-llm-7b")
    assert s["model_known"] is False
    assert s["context_window"] == 128_000
    assert [w["code"] for w in s["warnings"]] == ["unknown_model"]  # not silent
    known = await make_session(client, model="gpt-4o")
    assert known["warnings"] == []


async def test_explicit_window_overrides_catalog(client: httpx.AsyncClient) -> None:
    s = await make_session(client, model="gpt-4o", context_window=50_000, max_output_tokens=5_000)
    assert (s["context_window"], s["max_output_tokens"]) == (50_000, 5_000)
    assert s["usable_tokens"] == 45_000
    s = await make_session(client, model="gpt-4o", context_window=50_000, input_limit=30_000)
    assert s["input_limit"] == 30_000
    assert s["usable_tokens"] == 30_000


async def test_config_partial_overrides_merge_over_defaults(client: httpx.AsyncClient) -> None:
    s = await make_session(
        client, config={"prune": {"protect_tokens": 1234}, "compaction": {"threshold": 0.5}}
    )
    cfg = s["config"]
    assert cfg["prune"]["protect_tokens"] == 1234
    assert cfg["prune"]["minimum_tokens"] == 20_000  # default kept
    assert cfg["prune"]["protected_tools"] == ["skill"]
    assert cfg["compaction"]["threshold"] == 0.5
    assert cfg["compaction"]["reserve_tokens"] == 16_384
    assert cfg["truncate"]["tool_result_token_cap"] == 4_000
    assert (await get_session(client, s["id"]))["config"] == cfg


INVALID_CREATES: list[tuple[dict[str, Any], str]] = [
    ({"config": {"prune": {"bogus": 1}}}, "config.prune.bogus"),
    ({"config": {"nonsense": True}}, "config.nonsense"),
    ({"config": {"compaction": {"threshold": 1.5}}}, "config.compaction.threshold"),
    ({"config": {"compaction": {"threshold": 0}}}, "config.compaction.threshold"),
    (
        {"config": {"compaction": {"emergency_fraction": -1}}},
        "config.compaction.emergency_fraction",
    ),
    ({"config": {"compaction": "on"}}, "config.compaction"),
    ({"context_window": 1000, "max_output_tokens": 1000}, "max_output_tokens"),
    ({"context_window": 1000, "max_output_tokens": 5000}, "max_output_tokens"),
    ({"context_window": 1000, "input_limit": 2000}, "input_limit"),
    ({"context_window": 0}, "context_window"),
    ({"id": "bad id!"}, "id"),
    ({"id": "x" * 129}, "id"),
    ({"model": ""}, "model"),
    ({"surprise": 1}, "surprise"),
    ({"metadata": {"n": 10**30}}, "metadata.n"),
    ({"metadata": {"team": "a\u0000"}}, "metadata.team"),
]


async def test_create_rejects_invalid_bodies(client: httpx.AsyncClient) -> None:
    failures: list[str] = []
    for partial, field in INVALID_CREATES:
        body = {"model": "gpt-4o", **partial}
        try:
            assert_problem(await client.post("/v1/sessions", json=body), 422, field)
        except AssertionError as exc:
            failures.append(f"{partial}: {exc}")
    assert not failures, "\n".join(failures)
    assert_problem(await client.post("/v1/sessions", json={}), 422, "model")
    r = await client.get("/v1/sessions")
    assert r.json()["sessions"] == []


async def test_get_has_etag_of_version(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e1")
    r = await client.get("/v1/sessions/e1")
    assert r.headers["etag"] == '"1"'
    await append_ok(client, "e1", [{"role": "user", "content": "hello"}])
    r = await client.get("/v1/sessions/e1")
    assert r.json()["version"] == 2
    assert r.headers["etag"] == '"2"'


async def test_get_unknown_or_impossible_id_is_404(client: httpx.AsyncClient) -> None:
    for session_id in ["missing", "a%00b", "x" * 300, "%E2%9C%93", "..", "-x"]:
        assert_problem(await client.get(f"/v1/sessions/{session_id}"), 404)


async def test_list_paginates_every_session_once_in_creation_order(
    client: httpx.AsyncClient,
) -> None:
    created = [(await make_session(client, id=f"s{i}"))["id"] for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/v1/sessions", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["sessions"]) <= 3
        seen.extend(s["id"] for s in page["sessions"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert seen == created
    assert pages == 3


async def test_list_filters_by_metadata(client: httpx.AsyncClient) -> None:
    await make_session(client, id="a1", metadata={"team": "a", "env": "prod"})
    await make_session(client, id="a2", metadata={"team": "a", "env": "dev"})
    await make_session(client, id="b1", metadata={"team": "b"})
    await make_session(client, id="none")

    async def ids(*filters: str) -> list[str]:
        r = await client.get("/v1/sessions", params=[("metadata", f) for f in filters])
        assert r.status_code == 200, r.text
        return [s["id"] for s in r.json()["sessions"]]

    assert await ids("team=a") == ["a1", "a2"]
    assert await ids("team=a", "env=dev") == ["a2"]
    assert await ids("team=c") == []
    assert await ids() == ["a1", "a2", "b1", "none"]
    assert_problem(await client.get("/v1/sessions", params={"metadata": "team"}), 422, "metadata")
    assert_problem(
        await client.get("/v1/sessions", params={"metadata": "team=\u0000"}), 422, "metadata"
    )


async def test_list_rejects_forged_cursor(client: httpx.AsyncClient) -> None:
    await make_session(client, id="one")

    def forged(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    for cursor in [
        "garbage",
        "WzEsMl0",
        "!!!",
        forged(["not a date", "x"]),
        forged(["2020-01-01T00:00:00+00:00", "a\u0000b"]),  # a NUL must not reach Postgres
        forged(["2020-01-01T00:00:00", "a"]),  # a naive time
        forged({"a": 1}),
    ]:
        assert_problem(await client.get("/v1/sessions", params={"cursor": cursor}), 422, "cursor")


async def test_patch_deep_merges_config_and_replaces_metadata(client: httpx.AsyncClient) -> None:
    await make_session(
        client,
        id="p",
        config={"prune": {"protect_tokens": 1000, "minimum_tokens": 500}},
        metadata={"team": "a", "owner": "x"},
    )
    r = await client.patch(
        "/v1/sessions/p",
        json={
            "config": {"prune": {"minimum_tokens": 700}, "compaction": {"auto": False}},
            "metadata": {"team": "b"},
        },
    )
    assert r.status_code == 200, r.text
    s = r.json()
    assert s["config"]["prune"]["protect_tokens"] == 1000  # kept from the earlier override
    assert s["config"]["prune"]["minimum_tokens"] == 700
    assert s["config"]["compaction"]["auto"] is False
    assert s["config"]["compaction"]["enabled"] is True
    assert s["metadata"] == {"team": "b"}
    assert s["version"] == 2
    assert r.headers["etag"] == '"2"'
    assert await get_session(client, "p") == s

    # A null resets an override to the server default.
    r = await client.patch("/v1/sessions/p", json={"config": {"prune": {"protect_tokens": None}}})
    assert r.json()["config"]["prune"]["protect_tokens"] == 40_000
    assert r.json()["config"]["prune"]["minimum_tokens"] == 700
    assert r.json()["version"] == 3


async def test_patch_model_and_window(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p")
    r = await client.patch("/v1/sessions/p", json={"model": "claude-opus-4"})
    assert r.status_code == 200, r.text
    assert r.json()["context_window"] == 200_000
    r = await client.patch(
        "/v1/sessions/p", json={"context_window": 10_000, "max_output_tokens": 1_000}
    )
    assert r.json()["usable_tokens"] == 9_000
    r = await client.patch("/v1/sessions/p", json={"max_output_tokens": 20_000})
    assert_problem(r, 422, "max_output_tokens")
    assert (await get_session(client, "p"))["max_output_tokens"] == 1_000


async def test_patch_rejects_bad_config_without_change(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p")
    assert_problem(
        await client.patch("/v1/sessions/p", json={"config": {"prune": {"bogus": 1}}}),
        422,
        "config.prune.bogus",
    )
    assert_problem(await client.patch("/v1/sessions/p", json={"model": None}), 422, "model")
    s = await get_session(client, "p")
    assert s["version"] == 1
    assert "bogus" not in s["config"]["prune"]


async def test_patch_if_match(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p")
    r = await client.patch(
        "/v1/sessions/p", json={"metadata": {"v": 2}}, headers={"If-Match": '"1"'}
    )
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2
    stale = await client.patch(
        "/v1/sessions/p", json={"metadata": {"v": 3}}, headers={"If-Match": '"1"'}
    )
    doc = assert_problem(stale, 412)
    assert doc["current_version"] == 2
    s = await get_session(client, "p")
    assert s["metadata"] == {"v": 2}
    assert s["version"] == 2
    r = await client.patch("/v1/sessions/p", json={"metadata": {"v": 3}}, headers={"If-Match": "*"})
    assert r.json()["version"] == 3


async def test_patch_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.patch("/v1/sessions/nope", json={"metadata": {}}), 404)


async def test_delete_removes_session_and_messages(client: httpx.AsyncClient) -> None:
    await make_session(client, id="d")
    await make_session(client, id="keep")
    await append_ok(client, "d", [{"role": "user", "content": "secret"}])
    await append_ok(client, "keep", [{"role": "user", "content": "other"}])
    r = await client.delete("/v1/sessions/d")
    assert r.status_code == 204
    assert_problem(await client.get("/v1/sessions/d"), 404)
    assert_problem(await client.get("/v1/sessions/d/messages"), 404)
    assert_problem(await client.delete("/v1/sessions/d"), 404)
    # The same id starts from scratch: no old messages come back.
    await make_session(client, id="d")
    r = await client.get("/v1/sessions/d/messages")
    assert r.json()["entries"] == []
    assert (await get_session(client, "keep"))["entry_count"] == 1


async def test_delete_if_match_stale_keeps_the_session(client: httpx.AsyncClient) -> None:
    await make_session(client, id="d")
    await append_ok(client, "d", [{"role": "user", "content": "x"}])
    doc = assert_problem(await client.delete("/v1/sessions/d", headers={"If-Match": '"1"'}), 412)
    assert doc["current_version"] == 2
    assert (await get_session(client, "d"))["entry_count"] == 1
