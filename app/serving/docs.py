"""The interactive API docs, from files that ship with the package.

``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) are FastAPI's own pages, pointed at
``/static/…`` instead of a CDN, so they render on a machine with no internet
(``app/static/README.md`` says which versions and where they come from). ReDoc's page
leaves out the Google Fonts link FastAPI adds by default, for the same reason, and both
pages carry a Content-Security-Policy that keeps every load on this origin: ReDoc's
sidebar would fetch its maker's logo from the internet (it hides itself when that
fails), and the browser does not even try.

Each asset's URL carries a hash of its content (``?v=``): the file is cached for a year
(``immutable``) and a new version is a new URL. The pages themselves are revalidated on
every load, so they always name the current files. Text assets go out gzipped to
clients that accept it (Swagger UI's bundle: 1.6 MB, 430 KB gzipped), compressed
once per process on first request, not at start-up (the tests build many apps).
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from app.core.errors import NotFound

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
ASSET_PATH = "/static/{name}"

# The name in the URL -> (the file under app/static, its media type).
ASSETS: dict[str, tuple[str, str]] = {
    "swagger-ui-bundle.js": ("swagger-ui/swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui/swagger-ui.css", "text/css; charset=utf-8"),
    "redoc.standalone.js": ("redoc/redoc.standalone.js", "text/javascript; charset=utf-8"),
    "favicon.png": ("swagger-ui/favicon-32x32.png", "image/png"),
}

ASSET_CACHE_CONTROL = "public, max-age=31536000, immutable"
PAGE_CACHE_CONTROL = "no-cache"
# The pages' inline script (Swagger UI's set-up) and the styles both bundles inject;
# ReDoc's search runs in a worker made from a blob: URL.
PAGE_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'self'"
)


@dataclass(frozen=True)
class Asset:
    """One file, as it is served."""

    body: bytes
    media_type: str
    version: str  # a prefix of the content's sha256: the URL's ?v= and the ETag

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


@cache
def load_asset(name: str) -> Asset:
    """The asset ``name`` (a key of :data:`ASSETS`), read once per process."""
    relative, media_type = ASSETS[name]
    body = (STATIC_DIR / relative).read_bytes()
    return Asset(body, media_type, hashlib.sha256(body).hexdigest()[:16])


@cache
def gzipped(name: str) -> bytes:
    """The asset ``name`` gzipped, compressed once per process. ``mtime=0``: the same
    bytes every time, whichever process compressed them."""
    return gzip.compress(load_asset(name).body, compresslevel=6, mtime=0)


def _accepts_gzip(request: Request) -> bool:
    for coding in request.headers.get("accept-encoding", "").split(","):
        token, _, params = coding.strip().partition(";")
        if token.strip().lower() in ("gzip", "*") and params.replace(" ", "") != "q=0":
            return True
    return False


async def asset_url(request: Request, name: str) -> str:
    root = request.scope.get("root_path", "").rstrip("/")
    version = (await run_in_threadpool(load_asset, name)).version
    return f"{root}{ASSET_PATH.format(name=name)}?v={version}"


async def serve_asset(request: Request) -> Response:
    """``GET /static/{name}``: one of the docs' assets; any other name is a 404."""
    name = request.path_params["name"]
    if name not in ASSETS:
        raise NotFound(f"no such file: {name}")
    asset = await run_in_threadpool(load_asset, name)
    headers = {"Cache-Control": ASSET_CACHE_CONTROL, "ETag": asset.etag}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    body = asset.body
    if asset.media_type.startswith("text/"):
        headers["Vary"] = "Accept-Encoding"
        if _accepts_gzip(request):
            body = await run_in_threadpool(gzipped, name)
            headers["Content-Encoding"] = "gzip"
    return Response(body, media_type=asset.media_type, headers=headers)


def _page(page: HTMLResponse) -> HTMLResponse:
    page.headers["Cache-Control"] = PAGE_CACHE_CONTROL
    page.headers["Content-Security-Policy"] = PAGE_CSP
    return page


def install_docs(app: FastAPI) -> None:
    """``/docs`` and ``/redoc`` with the bundled assets; create the app with
    ``docs_url=None, redoc_url=None`` so that FastAPI's CDN pages are not there too."""
    openapi_path = app.openapi_url or "/openapi.json"

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_swagger_ui_html(
            openapi_url=root + openapi_path,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=await asset_url(request, "swagger-ui-bundle.js"),
            swagger_css_url=await asset_url(request, "swagger-ui.css"),
            swagger_favicon_url=await asset_url(request, "favicon.png"),
            # No call to swagger.io's online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )
        return _page(page)

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(
            openapi_url=root + openapi_path,
            title=f"{app.title} - ReDoc",
            redoc_js_url=await asset_url(request, "redoc.standalone.js"),
            redoc_favicon_url=await asset_url(request, "favicon.png"),
            with_google_fonts=False,
        )
        return _page(page)

    async def home(request: Request) -> RedirectResponse:
        # The start-up banner prints the service's URL: opening it shows the API.
        root = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(root + "/docs", status_code=307)

    app.add_route("/", home, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route("/docs", swagger_ui, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
    app.add_route(ASSET_PATH, serve_asset, include_in_schema=False)
