"""The ``session`` table lives on the storage floor (:mod:`app.store.tables`)."""

from __future__ import annotations

from app.core.tenancy import DEFAULT_TENANT
from app.store.tables import Session

__all__ = ["DEFAULT_TENANT", "Session"]
