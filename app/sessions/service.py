"""Session use cases (create, read, list, change and delete, each one transaction on
the driver), and a session's window and verdict in this process's model catalog (the
maths is app.engine.accounting.session_budget's)."""

from __future__ import annotations

import base64
import dataclasses
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core import model_catalog
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import Conflict, NotFound, PreconditionFailed, UnprocessableContent, invalid
from app.engine.accounting import budget, catalog, ledger, relief, session_budget
from app.engine.accounting.session_budget import SessionFigures
from app.sessions.schemas import (
    SESSION_ID_PATTERN,
    SessionConfig,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionPatch,
    SessionWarning,
    SummarizerUsage,
    _check_window,
)
from app.store import session_row
from app.store.session_row import NewSession, SessionRow, SessionState, advance


def merge_config(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``patch`` into ``base``; a null in the patch removes the key."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def effective_config(overrides: dict[str, Any]) -> SessionConfig:
    """The server defaults with the session's overrides applied. Raises 422 on bad keys."""
    try:
        return SessionConfig.model_validate(overrides)
    except ValidationError as exc:
        errors = [
            {"field": "config." + ".".join(str(p) for p in e["loc"]), "detail": e["msg"]}
            for e in exc.errors()
        ]
        raise UnprocessableContent(
            "; ".join(f"{e['field']}: {e['detail']}" for e in errors), errors=errors
        ) from None


def window_of(session: SessionFigures) -> tuple[budget.Window, catalog.ModelSpec]:
    """The session's window (app.engine.accounting.session_budget) in this process's
    catalog, the operator's overrides included. A model in no catalog is logged once
    per process."""
    spec = model_catalog.lookup(session.model)
    if session_budget.assumed_window(session, spec):
        model_catalog.assumed(session.model, spec)
    return session_budget.window_of(session, spec), spec


def warnings_of(
    session: SessionFigures, window: budget.Window, spec: catalog.ModelSpec
) -> list[SessionWarning]:
    """What the session document warns about: a window assumed for an unknown model."""
    if not session_budget.assumed_window(session, spec):
        return []
    return [
        SessionWarning(
            code="unknown_model",
            detail=f"model {session.model!r} is in no catalog: a context window of "
            f"{window.context_window} tokens with {window.max_output_tokens} output tokens is "
            "assumed (COMPACTD_DEFAULT_CONTEXT_WINDOW). Give the session its context_window "
            "(and max_output_tokens), or name the model in the operator's "
            "COMPACTD_MODEL_CATALOG.",
        )
    ]


def thresholds_of(config: SessionConfig) -> budget.Thresholds:
    c = config.compaction
    return budget.Thresholds(
        reserve_tokens=c.reserve_tokens,
        threshold=c.threshold,
        emergency_fraction=c.emergency_fraction,
    )


# The session's totals as the budget maths reads them (the engine's adapter), for the
# callers that take the window and verdict from here.
accounting_of = session_budget.accounting_of


def verdict_of(session: SessionState, config: SessionConfig | None = None) -> budget.Verdict:
    """The verdict from the session's totals; ``config`` when the caller has it already."""
    window, _ = window_of(session)
    config = config or effective_config(session.config)
    return session_budget.verdict_of(session, window, thresholds_of(config))


def auto_compaction_state(session: SessionState, config: SessionConfig) -> str:
    """Whether automatic compaction would run now, and if not, why."""
    if not (config.compaction.enabled and config.compaction.auto):
        return "off"
    if session.compaction_failures >= relief.FAILURE_LIMIT:
        return "stopped"
    held = session.compaction_held_seq
    if held is not None and session.next_seq <= held:
        return "held"
    return "on"


def to_schema(session: SessionRow) -> SessionOut:
    window, spec = window_of(session)
    config = effective_config(session.config)
    return SessionOut(
        id=session.id,
        parent_id=session.parent_id,
        model=session.model,
        context_window=window.context_window,
        max_output_tokens=window.max_output_tokens,
        input_limit=window.input_limit,
        usable_tokens=window.usable_tokens,
        model_known=spec.known,
        config=config,
        metadata=session.metadata,
        entry_count=session.entry_count,
        stored_tokens=session.stored_tokens,
        context_tokens=session.context_tokens,
        calibration_factor=session.calibration_factor,
        overhead_tokens=session.overhead_tokens,
        last_usage=session.last_usage,
        usage_count=session.usage_count,
        pruned_tokens=session.pruned_tokens,
        prune_count=session.prune_count,
        compaction_count=session.compaction_count,
        compaction_cost=SummarizerUsage(
            calls=session.summarizer_calls,
            input_tokens=session.summarizer_input_tokens,
            output_tokens=session.summarizer_output_tokens,
            cached_tokens=session.summarizer_cached_tokens,
        ),
        compaction_saved_tokens=session.compaction_saved_tokens,
        active_compaction_id=session.active_compaction_id,
        compaction_failures=session.compaction_failures,
        auto_compaction=auto_compaction_state(session, config),
        version=session.version,
        created_at=session.created_at,
        updated_at=session.updated_at,
        warnings=warnings_of(session, window, spec),
    )


def check_if_match(if_match: str | None, version: int) -> None:
    """``If-Match`` holds the expected version (``"3"``, ``3``, ``W/"3"`` or ``*``)."""
    if if_match is None or if_match.strip() == "*":
        return
    wanted = [v.strip().removeprefix("W/").strip('"') for v in if_match.split(",")]
    if str(version) not in wanted:
        raise PreconditionFailed(
            f"If-Match {if_match} does not match the current version {version}",
            current_version=version,
        )


def encode_cursor(session: SessionRow) -> str:
    raw = orjson.dumps([session.created_at.isoformat(), session.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, sid = orjson.loads(raw)
        after = datetime.fromisoformat(created_at)
        # Only what encode_cursor writes: an aware time and a valid id (a NUL or a
        # naive time would otherwise reach Postgres and fail there).
        if after.tzinfo is None or not re.fullmatch(SESSION_ID_PATTERN, sid):
            raise ValueError("not an issued cursor")
        # In UTC here, where an instant outside years 1-9999 (year 1 at +14:00)
        # is an OverflowError, not in the driver, where it was a 500.
        return after.astimezone(UTC), sid
    except (ValueError, TypeError, OverflowError, orjson.JSONDecodeError):
        raise invalid("cursor", "is not a cursor this service issued") from None


class SessionService:
    """Sessions of one tenant, each use case in one transaction of its own."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def require(self, session_id: str) -> SessionRow:
        async with driver_connection(self.engine) as driver:
            return await _require(driver, self.tenant_id, session_id)

    async def create(self, body: SessionCreate) -> SessionRow:
        effective_config(body.config)
        session_id = body.id or f"ses_{uuid.uuid4().hex}"
        new = NewSession(
            id=session_id,
            parent_id=body.parent_id,
            model=body.model,
            context_window=body.context_window,
            max_output_tokens=body.max_output_tokens,
            input_limit=body.input_limit,
            config=body.config,
            metadata=body.metadata,
        )
        async with driver_connection(self.engine) as driver, driver.transaction():
            if await session_row.exists(driver, self.tenant_id, session_id):
                raise Conflict(f"session {session_id!r} already exists")
            if body.parent_id is not None and not await session_row.exists(
                driver, self.tenant_id, body.parent_id
            ):
                # The body names what does not exist (the route does): 422, naming the field.
                raise invalid(
                    "parent_id",
                    f"session {body.parent_id!r} does not exist: parent_id names a session of "
                    "the same tenant",
                )
            # A new family, stored under the session's id, unless a family still stores
            # entries under it (a session of that id was deleted while a fork of it lives).
            family_id = session_id
            if await session_row.family_taken(driver, self.tenant_id, session_id):
                family_id = f"fam_{uuid.uuid4().hex}"
            try:
                return await session_row.insert(driver, self.tenant_id, new, family_id)
            except asyncpg.IntegrityConstraintViolationError as exc:
                if "session_parent_id_tenant_id_fkey" in str(exc):  # deleted meanwhile
                    raise NotFound(f"session {body.parent_id!r} does not exist") from None
                # a concurrent create with the same id won
                raise Conflict(f"session {session_id!r} already exists") from None

    async def list(
        self,
        *,
        limit: int,
        cursor: str | None,
        metadata: dict[str, Any],
        parent_id: str | None = None,
    ) -> SessionPage:
        """A page in creation order; ``parent_id``: only that session's children."""
        after = decode_cursor(cursor) if cursor else None
        async with driver_connection(self.engine) as driver:
            rows = await session_row.list_rows(
                driver,
                self.tenant_id,
                limit=limit + 1,
                after=after,
                metadata=metadata,
                parent_id=parent_id,
            )
        page = rows[:limit]
        return SessionPage(
            sessions=[to_schema(s) for s in page],
            next_cursor=encode_cursor(page[-1]) if len(rows) > limit else None,
        )

    async def patch(self, session_id: str, body: SessionPatch, if_match: str | None) -> SessionRow:
        async with driver_connection(self.engine) as driver, driver.transaction():
            session = await _require(driver, self.tenant_id, session_id, for_update=True)
            check_if_match(if_match, session.version)
            before = dataclasses.replace(session)
            _patched(session, body)
            await session_row.write_row(driver, self.tenant_id, session, before, datetime.now(UTC))
        return session

    async def delete(self, session_id: str, if_match: str | None) -> None:
        """The session and all of its data. Its children (``parent_id``) are kept, their
        ``parent_id`` set to null by the database (``ON DELETE SET NULL``)."""
        async with driver_connection(self.engine) as driver, driver.transaction():
            session = await _require(driver, self.tenant_id, session_id, for_update=True)
            check_if_match(if_match, session.version)
            await session_row.delete(driver, self.tenant_id, session_id, session.family_id)


async def _require(
    driver: Driver, tenant_id: str, session_id: str, *, for_update: bool = False
) -> SessionRow:
    session = await session_row.read_row(driver, tenant_id, session_id, for_update=for_update)
    if session is None:
        raise NotFound(f"session {session_id!r} does not exist")
    return session


def _patched(session: SessionRow, body: SessionPatch) -> None:
    """``session`` changed as ``body`` says (in memory: the caller writes it)."""
    fields = body.model_fields_set
    if "model" in fields:
        if body.model is None:
            raise invalid("model", "must not be null")
        session.model = body.model
    for name in ("context_window", "max_output_tokens", "input_limit"):
        if name in fields:
            setattr(session, name, getattr(body, name))
    try:
        _check_window(session.context_window, session.max_output_tokens, session.input_limit)
    except ValueError as exc:
        raise invalid("body", str(exc)) from None
    if "config" in fields:
        merged = merge_config(session.config, body.config or {})
        effective_config(merged)
        session.config = merged
    if "metadata" in fields:
        session.metadata = body.metadata or {}
    # New config, new pruning rules: the next append or report looks again.
    advance(session, ledger.Patched(config="config" in fields))
