"""The tenant a request acts for, as resolved by :class:`app.keys.auth.AuthMiddleware`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.errors import Unauthorized

# Whom every request acts for while no API key exists (open mode: app.keys.auth).
DEFAULT_TENANT = "default"


async def get_tenant(request: Request) -> str:
    # async: FastAPI would run a plain function in its thread pool, on every request.
    tenant: str | None = request.scope.get("state", {}).get("tenant")
    if tenant is None:  # a route the middleware did not cover: fail closed
        raise Unauthorized("no API key was checked for this route")
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]
