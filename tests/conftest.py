"""Shared fixtures: a real Postgres, a migrated database per test, the app and clients."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.core.tokenizer import load_encodings
from app.engine.accounting.tokens import register_encodings
from app.main import create_app
from tests import parallel, postgres
from tests.tiktoken_cache import install_offline_encodings
from tests.upstream_server import upstream_fixture, upstream_server_fixture  # noqa: F401

TEST_SETTINGS = Settings(
    database_url=None,
    tiktoken_cache_dir=Path(__file__).resolve().parents[1] / "var" / "tiktoken",
    max_body_bytes=2 * 1024 * 1024,
    db_pool_size=5,
    db_max_overflow=30,
    # Tests that need workers start them (tests/compactions): the rest see queued jobs stay.
    compaction_workers=0,
    # The webhook receivers and remote summarizers the tests start listen on loopback, and
    # tenants' URLs reach no loopback address unless the operator allows it
    # (app.core.outbound; tests/webhooks/test_outbound_policy.py runs without it).
    outbound_allow="127.0.0.1/32,::1/128",
)

# httpcore asks for sniffio on every request it sends (``import sniffio`` inside
# current_async_library) and takes asyncio when it is missing, as it is here: anyio 4 and
# httpx 0.28 no longer install it. Python does not remember a failed import, so each
# request searched every sys.path entry again: a fifth of a trace replay's time over real
# HTTP. Remember the miss; the import fails as before, at once.
if importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]  # None: "not importable"

_RUN = pytest.StashKey[tuple[contextlib.ExitStack, str, str, Path]]()
_LOCK = pytest.StashKey[parallel.RunLock]()


def pytest_configure(config: pytest.Config) -> None:
    if parallel.is_controller(config):  # it runs no test: it starts the workers' Postgres
        with contextlib.ExitStack() as stack:
            kind, url = stack.enter_context(postgres.postgres_server())
            folder = Path(tempfile.mkdtemp(prefix="compactd-run-"))
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            print(f"[compactd tests] Postgres from {kind}, shared by the workers")
            config.stash[_RUN] = (stack.pop_all(), kind, url, folder)
        return
    # Tests count tokens without an app too. tiktoken's own get_encoding, the reference some
    # tests check the counts against, reads its cache folder: filled once per run.
    register_encodings(load_encodings())
    install_offline_encodings(TEST_SETTINGS.tiktoken_cache_dir)
    if (shared := parallel.from_controller(config)) is not None:
        worker: str = config.workerinput["workerid"]  # type: ignore[attr-defined]
        postgres.use(postgres.Names(shared["run"], worker))
        config.stash[_LOCK] = parallel.RunLock(Path(shared["folder"]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than there are CPUs to run on (the tests wait on
    sockets, subprocesses and timeouts a good part of their time), unless
    PYTEST_XDIST_AUTO_NUM_WORKERS says how many."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or len(os.sched_getaffinity(0)) + 1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller hands each xdist worker the run's Postgres and lock folder."""
    _, _, url, folder = node.config.stash[_RUN]
    node.workerinput[parallel.WORKER_INPUT] = {
        "url": url,
        "run": postgres.names.run,
        "folder": str(folder),
    }


def pytest_unconfigure(config: pytest.Config) -> None:
    if _RUN in config.stash:
        stack, kind, url, _ = config.stash[_RUN]
        with stack:  # then stop the server (a shared DATABASE_URL one keeps running)
            if kind == "DATABASE_URL":
                asyncio.run(postgres.drop_run(url, postgres.names.run_prefix))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if (shared := parallel.from_controller(config)) is not None:
        items[:] = parallel.in_run_order(items)
        parallel.note_slow_tests(Path(shared["folder"]), items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if _RUN in config.stash and config.getvalue("dist") == "loadfile":
        return parallel.scheduler(config, log, config.stash[_RUN][3])
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """In a parallel run, each test holds the run's lock (tests/parallel.py): shared, or
    exclusive for an ``alone`` test, kept until its module's last ``alone`` test."""
    lock = item.config.stash.get(_LOCK, None)
    if lock is None:
        return (yield)
    alone = item.get_closest_marker("alone") is not None
    if lock.held and lock.exclusive != alone:
        lock.release()
    if not lock.held:
        lock.take(exclusive=alone)
    try:
        return (yield)
    finally:
        keep = (
            alone
            and nextitem is not None
            and nextitem.get_closest_marker("alone") is not None
            and nextitem.path == item.path
        )
        if not keep:
            lock.release()


@pytest.fixture(scope="session")
def admin_url(pytestconfig: pytest.Config) -> Iterator[str]:
    shared = parallel.from_controller(pytestconfig)
    if shared is not None:
        postgres.prepare_template(shared["url"])
        yield shared["url"]
        # What this worker's tests left behind (a test killed before its teardown).
        asyncio.run(postgres.drop_run(shared["url"], postgres.names.prefix))
        return
    with postgres.postgres_server() as (kind, url):
        print(f"\n[compactd tests] Postgres from {kind}")
        postgres.prepare_template(url)
        yield url
        if kind == "DATABASE_URL":
            asyncio.run(postgres.drop_run(url, postgres.names.run_prefix))


@pytest.fixture(scope="session")
async def clones(admin_url: str) -> AsyncIterator[postgres.Clones]:
    made = postgres.Clones(admin_url)
    yield made
    await made.settle()


@pytest.fixture
async def db_url(clones: postgres.Clones, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh database cloned from the migrated template, dropped after the test. An
    ``alone`` test has no copy made or dropped beside it while it runs."""
    alone = request.node.get_closest_marker("alone") is not None
    url = await clones.take(ahead=not alone)
    yield url
    await clones.give_back(url, behind=not alone)


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
