"""``/docs`` and ``/redoc`` render in a real browser with no internet.

Debian's ``chromium``, headless, opens each page on a real uvicorn server and dumps the
DOM once the page's scripts have run. Everything it would fetch from anywhere but
loopback goes to a proxy here that only answers 502 (and no name resolves but
127.0.0.1), so a page that needs a CDN renders blank, and the test finds no operation
on it. Every operation of the spec must be on each page (its path and its summary).

Without ``chromium`` on PATH the tests are skipped, except in CI (``CI=true``), whose
``.ci/run`` installs it: there they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import running

# Where FastAPI's stock pages, Swagger UI and ReDoc fetch from when left to themselves.
OUTSIDE_HOSTS = (
    "cdn.jsdelivr.net",
    "unpkg.com",
    "fonts.googleapis.com",
    "fonts.gstatic.com",
    "cdn.redoc.ly",
    "validator.swagger.io",
    "fastapi.tiangolo.com",
)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not on PATH in CI: .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not on PATH: `apt-get install chromium` runs the browser tests")


@contextlib.contextmanager
def dead_end_proxy() -> Iterator[tuple[int, list[str]]]:
    """A loopback HTTP proxy that answers every request 502; yields its port and the
    request lines it was sent (the browser's attempts to reach beyond loopback)."""
    seen: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    head = conn.recv(8192)
                    seen.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                    conn.sendall(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n"
                    )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def rendered_dom(chromium: str, url: str, proxy_port: int, profile: Path) -> str:
    """The page's DOM after its scripts ran (up to 60 s of the page's virtual time,
    which waits for the page's own fetches and skips ahead while it is idle)."""
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            # Nothing beyond loopback: no name resolves but 127.0.0.1, and every request
            # that is not for loopback (those bypass a proxy) goes to the dead end.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--proxy-server=http://127.0.0.1:{proxy_port}",
            "--virtual-time-budget=60000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def operations(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(method, path, summary) of every operation in the spec."""
    return [
        (method, path, operation["summary"])
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    ]


def loaded_urls(dom: str) -> list[str]:
    """What the page's elements load: scripts, style sheets, icons, images."""
    return re.findall(r"<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=\"([^\"]*)\"", dom)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_page_renders_every_operation_with_no_internet(
    page: str, chromium: str, db_url: str, tmp_path: Path
) -> None:
    application = create_app(TEST_SETTINGS, database_url=db_url)
    spec = application.openapi()
    expected = operations(spec)
    assert len(expected) >= 10, "the spec lists the API's operations"
    with running(application) as base, dead_end_proxy() as (proxy_port, outside):
        dom = await asyncio.to_thread(
            rendered_dom, chromium, base + page, proxy_port, tmp_path / "profile"
        )
    print(f"{page}: {len(dom)} characters of DOM; requests beyond loopback: {outside}")

    missing = [
        (method, path, summary)
        for method, path, summary in expected
        if html.escape(path, quote=False) not in dom or html.escape(summary, quote=False) not in dom
    ]
    assert not missing, f"{page} rendered without these operations: {missing}"
    if page == "/docs":  # Swagger UI: one block per operation, named by its path
        shown = re.findall(r'class="opblock-summary-path"[^>]*data-path="([^"]*)"', dom)
        assert sorted(shown) == sorted(html.escape(p, quote=False) for _, p, _ in expected)

    # Everything the page loads comes from the service itself.
    for url in loaded_urls(dom):
        assert url.startswith(("/", base + "/")) or url.startswith("data:"), url
    tried = [line for line in outside if any(host in line for host in OUTSIDE_HOSTS)]
    assert not tried, f"{page} tried to reach the internet: {tried}"
