"""The ``session`` table lives on the storage floor (:mod:`app.store.tables`)."""

from __future__ import annotations

from app.store.tables import Session

DEFAULT_TENANT = "default"

__all__ = ["DEFAULT_TENANT", "Session"]
