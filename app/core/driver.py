"""The database driver as the SQL code sees it: a typed interface, rows by name.

The hot paths (append, context, prune, usage, the compaction queue) run their SQL
on a bare asyncpg connection, where SQLAlchemy's per-statement work would cost
more than the queries. :class:`Driver` is the part of asyncpg's connection they
use, so ``mypy --strict`` checks every call; :func:`record_of` turns a row into a
typed record by column name, so a read never depends on a column order written
down in another module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeVar

from asyncpg import Record
from asyncpg.transaction import Transaction

__all__ = ["Driver", "Record", "column_names", "record_of"]

Isolation = Literal["read_committed", "read_uncommitted", "serializable", "repeatable_read"]


class Driver(Protocol):
    """An asyncpg connection, as far as the service's SQL uses it."""

    async def execute(self, query: str, *args: object) -> str: ...

    async def fetch(self, query: str, *args: object) -> list[Record]: ...

    async def fetchrow(self, query: str, *args: object) -> Record | None: ...

    async def fetchval(
        self,
        query: str,
        *args: object,
        column: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any: ...

    def transaction(
        self,
        *,
        isolation: Isolation | None = None,
        readonly: bool = False,
        deferrable: bool = False,
    ) -> Transaction: ...

    def is_closed(self) -> bool: ...

    def terminate(self) -> None: ...


T = TypeVar("T")


_NAMES: dict[type[Any], tuple[str, ...]] = {}


def column_names(cls: type[Any]) -> tuple[str, ...]:
    """The fields of a dataclass record, which are the names of the columns it reads."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def record_of(cls: type[T], row: Mapping[str, Any] | Record) -> T:
    """``row`` as a ``cls`` (a dataclass), each field taken from the column of its name."""
    return cls(**{name: row[name] for name in column_names(cls)})
