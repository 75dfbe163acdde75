"""Shared fixtures: a real Postgres, a migrated database per test, the app and clients."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core import migrations
from app.core.settings import Settings
from app.core.tokenizer import install_offline_encodings, load_encodings
from app.engine.tokens import register_encodings
from app.main import create_app
from tests import postgres
from tests.upstream_server import upstream_fixture, upstream_server_fixture  # noqa: F401

TEST_SETTINGS = Settings(
    database_url=None,
    tiktoken_cache_dir=Path(__file__).resolve().parents[1] / "var" / "tiktoken",
    max_body_bytes=2 * 1024 * 1024,
    db_pool_size=5,
    db_max_overflow=30,
    # Tests that need workers start them (tests/compactions): the rest see queued jobs stay.
    compaction_workers=0,
)
# Tests count tokens without an app too. tiktoken's own get_encoding, the reference some
# tests check the counts against, reads its cache folder: filled once per run.
register_encodings(load_encodings())
install_offline_encodings(TEST_SETTINGS.tiktoken_cache_dir)

# httpcore asks for sniffio on every request it sends (``import sniffio`` inside
# current_async_library) and takes asyncio when it is missing, as it is here: anyio 4 and
# httpx 0.28 no longer install it. Python does not remember a failed import, so each
# request searched every sys.path entry again: a fifth of a trace replay's time over real
# HTTP. Remember the miss; the import fails as before, at once.
if importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]  # None: "not importable"


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    with postgres.postgres_server() as (kind, url):
        print(f"\n[compactd tests] Postgres from {kind}")
        asyncio.run(postgres.create_template(url))
        migrations.upgrade(postgres.with_database(url, postgres.TEMPLATE))
        yield url


@pytest.fixture
async def db_url(admin_url: str) -> AsyncIterator[str]:
    url = await postgres.clone(admin_url)
    yield url
    await postgres.drop(admin_url, url)


@pytest.fixture
def settings() -> Settings:
    return TEST_SETTINGS


@pytest.fixture
async def app(db_url: str, settings: Settings) -> AsyncIterator[Any]:
    application = create_app(settings, database_url=db_url)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
        yield c


async def make_session(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("model", "gpt-4o")
    r = await client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data
