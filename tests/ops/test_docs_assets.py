"""The docs pages and their bundled assets, as HTTP sees them: small pages that name
only this service's files, assets cached for good under a content hash, gzipped for
clients that take it, 304 on revalidation, 404 for anything else. (That the pages
render in a browser with no internet: tests/e2e/test_docs_in_browser.py.)"""

from __future__ import annotations

import gzip
import hashlib
import re

import httpx
import pytest

from app.serving.docs import ASSETS, STATIC_DIR


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_pages_are_small_and_name_only_local_files(
    client: httpx.AsyncClient, page: str
) -> None:
    r = await client.get(page)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    print(f"{page}: {len(r.content)} bytes")
    assert len(r.content) < 4096
    assert r.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "/openapi.json" in r.text
    urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert urls, r.text
    for url in urls:
        assert url.startswith("/static/"), url
    assert "http://" not in r.text
    assert "https://" not in r.text


async def test_assets_are_the_shipped_files_cached_under_their_hash(
    client: httpx.AsyncClient,
) -> None:
    pages = (await client.get("/docs")).text + (await client.get("/redoc")).text
    urls = set(re.findall(r'(/static/[^"?]+\?v=[0-9a-f]+)', pages))
    assert {u.split("?")[0].removeprefix("/static/") for u in urls} == set(ASSETS)
    for url in sorted(urls):
        name = url.split("?")[0].removeprefix("/static/")
        shipped = (STATIC_DIR / ASSETS[name][0]).read_bytes()
        assert url.endswith("?v=" + hashlib.sha256(shipped).hexdigest()[:16])

        plain = await client.get(url, headers={"Accept-Encoding": "identity"})
        assert plain.status_code == 200
        assert plain.content == shipped
        assert plain.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert plain.headers["content-type"] == ASSETS[name][1]
        assert "content-encoding" not in plain.headers

        packed = await client.get(url, headers={"Accept-Encoding": "gzip, br"})
        raw = packed.headers.get("content-length")
        print(f"{name}: {len(shipped)} bytes, {raw} on the wire with gzip")
        if name.endswith((".js", ".css")):
            assert packed.headers["content-encoding"] == "gzip"
            assert packed.headers["vary"] == "Accept-Encoding"
            assert int(raw or 0) < len(shipped) / 2
        assert packed.content == shipped  # httpx decodes it

        again = await client.get(url, headers={"If-None-Match": plain.headers["etag"]})
        assert again.status_code == 304
        assert again.content == b""


async def test_no_other_file_is_served(client: httpx.AsyncClient) -> None:
    for path in ("/static/LICENSE", "/static/..%2Fcore%2Fdocs.py", "/static/redoc.js"):
        r = await client.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_the_spec_does_not_list_the_docs_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert not [p for p in spec["paths"] if p.startswith(("/docs", "/redoc", "/static"))]
    assert (await client.get("/docs/oauth2-redirect")).status_code == 404


def test_gzip_is_deterministic() -> None:
    from app.serving.docs import gzipped, load_asset

    body = gzipped("swagger-ui.css")
    assert gzip.decompress(body) == load_asset("swagger-ui.css").body
    assert body[4:8] == b"\0\0\0\0"  # no timestamp
