"""The tenant a request acts for. One default tenant until API keys arrive."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from app.sessions.models import DEFAULT_TENANT


async def get_tenant() -> str:
    # async: FastAPI would run a plain function in its thread pool, on every request.
    return DEFAULT_TENANT


TenantDep = Annotated[str, Depends(get_tenant)]
