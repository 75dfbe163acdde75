"""`compactd keys create | list | revoke`, and `serve`'s rule for running without keys,
run as the real command against the test database."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.keys import tokens
from app.keys.auth import is_loopback, open_bind_refusal
from tests import postgres
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPACTD = str(Path(sys.executable).parent / "compactd")


def _env(db_url: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "COMPACTD_TIKTOKEN_CACHE_DIR": str(TEST_SETTINGS.tiktoken_cache_dir),
        "COMPACTD_LOG_LEVEL": "warning",
        **extra,
    }
    env.pop("COMPACTD_DATABASE_URL", None)
    return env


async def _compactd(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [COMPACTD, *args],
        cwd=ROOT,
        env=_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _rows(db_url: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        return [dict(r) for r in await conn.fetch("SELECT * FROM api_key")]
    finally:
        await conn.close()


async def test_create_prints_the_key_once_and_stores_only_its_hash(db_url: str) -> None:
    done = await _compactd(db_url, "keys", "create", "--tenant", "acme", "--name", "ci bot")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    parsed = tokens.parse(key)
    assert parsed is not None, done.stdout
    key_id, secret = parsed
    assert "only time" in done.stderr
    rows = await _rows(db_url)
    assert len(rows) == 1
    assert rows[0]["id"] == key_id
    assert rows[0]["tenant_id"] == "acme"
    assert rows[0]["name"] == "ci bot"
    assert secret not in repr(rows)
    assert key not in repr(rows)
    assert tokens.matches(bytes(rows[0]["secret_sha256"]), key_id, secret)


async def test_list_shows_keys_without_secrets_and_revoke_marks_them(db_url: str) -> None:
    first = (await _compactd(db_url, "keys", "create", "--tenant", "acme")).stdout.strip()
    second = (await _compactd(db_url, "keys", "create", "--tenant", "globex")).stdout.strip()
    revoked = await _compactd(db_url, "keys", "revoke", first[4:16])
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked key" in revoked.stdout

    table = await _compactd(db_url, "keys", "list")
    assert table.returncode == 0, table.stderr
    for key in (first, second):
        assert key[4:16] in table.stdout
        assert key[17:] not in table.stdout

    listed = json.loads((await _compactd(db_url, "keys", "list", "--json")).stdout)
    by_id = {k["id"]: k for k in listed}
    assert by_id[first[4:16]]["revoked_at"] is not None
    assert by_id[second[4:16]]["revoked_at"] is None
    assert set(by_id[first[4:16]]) == {"id", "tenant", "name", "created_at", "revoked_at", "status"}

    only = json.loads(
        (await _compactd(db_url, "keys", "list", "--tenant", "globex", "--json")).stdout
    )
    assert [k["tenant"] for k in only] == ["globex"]
    # The whole key works as the argument too; revoking twice is harmless.
    again = await _compactd(db_url, "keys", "revoke", first)
    assert again.returncode == 0, again.stderr


async def test_bad_arguments_get_clear_errors(db_url: str) -> None:
    bad = await _compactd(db_url, "keys", "create", "--tenant", "no spaces allowed")
    assert bad.returncode == 2
    assert "invalid tenant" in bad.stderr
    missing = await _compactd(db_url, "keys", "revoke", "0123456789ab")
    assert missing.returncode == 1
    assert "no key" in missing.stderr
    assert await _rows(db_url) == []


def test_open_mode_is_for_loopback_only() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
        assert open_bind_refusal(host, keys_exist=False, insecure=False) is None
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com"):
        assert not is_loopback(host), host
        refusal = open_bind_refusal(host, keys_exist=False, insecure=False)
        assert refusal is not None
        assert "compactd keys create" in refusal
        assert open_bind_refusal(host, keys_exist=True, insecure=False) is None
        assert open_bind_refusal(host, keys_exist=False, insecure=True) is None


async def _serve(db_url: str, *args: str, within: float = 30.0) -> tuple[int | None, str, bool]:
    """Start `compactd serve`; (exit code if it exited, its stderr, whether /healthz answered)."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        COMPACTD,
        "serve",
        "--no-migrate",
        "--port",
        str(port),
        *args,
        cwd=ROOT,
        env=_env(db_url, COMPACTD_COMPACTION_WORKERS="0"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    answered = False
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        async with httpx.AsyncClient() as http:
            while process.returncode is None and loop.time() < deadline:
                try:
                    r = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    answered = r.status_code == 200
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
    assert process.stderr is not None
    stderr = (await process.stderr.read()).decode()
    code = None if answered else process.returncode
    return code, stderr, answered


async def test_serve_refuses_a_public_bind_without_keys(db_url: str) -> None:
    code, stderr, answered = await _serve(db_url, "--host", "0.0.0.0")
    assert not answered
    assert code == 2
    assert "refusing to serve on 0.0.0.0 without API keys" in stderr
    assert "--insecure-no-auth" in stderr


async def test_serve_binds_publicly_with_the_insecure_flag_or_with_keys(db_url: str) -> None:
    _, stderr, answered = await _serve(db_url, "--host", "0.0.0.0", "--insecure-no-auth")
    assert answered, stderr
    assert (await _compactd(db_url, "keys", "create", "--tenant", "acme")).returncode == 0
    _, stderr, answered = await _serve(db_url, "--host", "0.0.0.0")
    assert answered, stderr


async def test_list_shows_each_keys_status(db_url: str) -> None:
    kept = (await _compactd(db_url, "keys", "create", "--tenant", "acme")).stdout.strip()
    gone = (await _compactd(db_url, "keys", "create", "--tenant", "acme")).stdout.strip()
    assert (await _compactd(db_url, "keys", "revoke", gone)).returncode == 0
    table = (await _compactd(db_url, "keys", "list")).stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "TENANT", "STATUS"]
    status = {line.split()[0]: line.split()[2] for line in table[1:]}
    assert status == {kept[4:16]: "active", gone[4:16]: "revoked"}
    listed = json.loads((await _compactd(db_url, "keys", "list", "--json")).stdout)
    assert {k["id"]: k["status"] for k in listed} == status


async def _overflow_without_a_key(client: httpx.AsyncClient, until: int) -> httpx.Response:
    """GET a session's verdict without a key until the answer is ``until`` (the server
    notices a change of the key table within its cache period), or give up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        r = await client.get("/v1/sessions/demo/overflow")
        if r.status_code == until or loop.time() > deadline:
            return r
        await asyncio.sleep(0.05)


async def test_deleting_every_key_opens_the_service_again(db_url: str) -> None:
    """The security walk-through: keys on, a key revoked (everyone is locked out, keys
    or not), then the keys deleted through the CLI: the running service is open again,
    sessions kept. Before, revoked keys locked it for good: `keys` could not delete."""
    from app.main import create_app
    from tests.ops.conftest import bearer, settings_with

    application = create_app(settings_with(auth_cache_seconds=0.5), database_url=db_url)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
            assert (await c.post("/v1/sessions", json={"id": "demo", "model": "gpt-4o"})).is_success
            key = (await _compactd(db_url, "keys", "create", "--tenant", "default")).stdout
            key = key.strip()
            assert (await _overflow_without_a_key(c, 401)).status_code == 401
            r = await c.get("/v1/sessions/demo/overflow", headers=bearer(key))
            assert r.status_code == 200, r.text
            assert (await _compactd(db_url, "keys", "revoke", key)).returncode == 0
            assert (await _overflow_without_a_key(c, 401)).status_code == 401

            deleted = await _compactd(db_url, "keys", "delete", key)
            assert deleted.returncode == 0, deleted.stderr
            assert f"deleted key {key[4:16]} of tenant 'default' (revoked)" in deleted.stdout
            assert "the service is open again" in deleted.stdout
            opened = await _overflow_without_a_key(c, 200)
            assert opened.status_code == 200, opened.text  # the session is still there
            # The deleted key is no key at all now.
            r = await c.get("/v1/sessions/demo/overflow", headers=bearer(key))
            assert r.status_code == 401
    listing = await _compactd(db_url, "keys", "list")
    assert listing.stdout.splitlines()[1].startswith("(no keys: the service is open")
    assert await _rows(db_url) == []


async def test_delete_all_and_its_refusals(db_url: str) -> None:
    for tenant in ("acme", "acme", "globex"):
        assert (await _compactd(db_url, "keys", "create", "--tenant", tenant)).returncode == 0
    neither = await _compactd(db_url, "keys", "delete")
    assert neither.returncode == 2
    assert "--all" in neither.stderr
    tenant_alone = await _compactd(db_url, "keys", "delete", "--tenant", "acme")
    assert tenant_alone.returncode == 2
    missing = await _compactd(db_url, "keys", "delete", "0123456789ab")
    assert missing.returncode == 1
    assert "no key '0123456789ab'" in missing.stderr
    assert len(await _rows(db_url)) == 3

    acme = await _compactd(db_url, "keys", "delete", "--all", "--tenant", "acme")
    assert acme.returncode == 0, acme.stderr
    assert acme.stdout.count("deleted key") == 2
    assert "open again" not in acme.stdout  # globex's key is still there
    assert [r["tenant_id"] for r in await _rows(db_url)] == ["globex"]
    every = await _compactd(db_url, "keys", "delete", "--all")
    assert every.returncode == 0, every.stderr
    assert every.stdout.count("deleted key") == 1
    assert "the service is open again" in every.stdout
    assert await _rows(db_url) == []
