"""Running Alembic from the CLI and the tests."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from alembic import command
from app.core.settings import PROJECT_ROOT


def _ini_path() -> Path:
    for base in (PROJECT_ROOT, Path.cwd()):
        if (base / "alembic.ini").exists() and (base / "alembic").is_dir():
            return base / "alembic.ini"
    raise FileNotFoundError(
        "alembic.ini and alembic/ not found next to the package or in the working directory"
    )


def alembic_config(url: str | None = None) -> Config:
    config = Config(str(_ini_path()))
    config.attributes["configure_logger"] = False
    if url:
        config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


@lru_cache
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
