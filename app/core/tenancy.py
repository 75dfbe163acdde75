"""The tenant a request acts for. One default tenant until API keys arrive."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from app.sessions.models import DEFAULT_TENANT


def get_tenant() -> str:
    return DEFAULT_TENANT


TenantDep = Annotated[str, Depends(get_tenant)]
