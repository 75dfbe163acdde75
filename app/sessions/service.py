"""Session use cases: create, read, list, change and delete."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core import model_catalog
from app.core.errors import Conflict, NotFound, PreconditionFailed, UnprocessableContent, invalid
from app.engine import tree
from app.engine.accounting import budget, catalog, ledger, relief
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from app.sessions.schemas import (
    SESSION_ID_PATTERN,
    SessionConfig,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionPatch,
    SessionWarning,
    _check_window,
)
from app.store.session_row import SessionRepository, advance
from app.store.tables import Branch, Session


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


class Budgeted(Protocol):
    """What the budget maths reads of a session: an ORM row, or the locked row of an append."""

    @property
    def model(self) -> str: ...
    @property
    def context_window(self) -> int | None: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def input_limit(self) -> int | None: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def calibration_factor(self) -> float: ...
    @property
    def overhead_tokens(self) -> int: ...
    @property
    def reported_prompt_tokens(self) -> int | None: ...
    @property
    def context_tokens_at_report(self) -> int | None: ...


def window_of(session: Budgeted) -> tuple[budget.Window, catalog.ModelSpec]:
    """The session's window: its own figures, else the catalog's (the operator's
    overrides included). A model in no catalog is logged once per process."""
    spec = model_catalog.lookup(session.model)
    max_output = session.max_output_tokens or spec.max_output_tokens
    if not spec.known:
        if session.context_window and not session.max_output_tokens:
            # The default cap is the default window's: a quarter of a smaller window.
            max_output = catalog.unknown_max_output(session.context_window)
        if assumed_window(session, spec):
            model_catalog.assumed(session.model, spec)
    window = budget.Window(
        context_window=session.context_window or spec.context_window,
        max_output_tokens=max_output,
        input_limit=session.input_limit
        if session.input_limit is not None
        else (spec.input_limit if session.context_window is None else None),
    )
    return window, spec


def assumed_window(session: Budgeted, spec: catalog.ModelSpec) -> bool:
    """Whether the session's window is a default: its model is in no catalog and
    the session does not give its own window."""
    return not spec.known and not session.context_window and not session.input_limit


def warnings_of(
    session: Budgeted, window: budget.Window, spec: catalog.ModelSpec
) -> list[SessionWarning]:
    """What the session document warns about: a window assumed for an unknown model."""
    if not assumed_window(session, spec):
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


def accounting_of(session: Budgeted) -> budget.Accounting:
    """The session's totals as the budget maths reads them. The one source of
    the estimate: ``/overflow``, ``/context``, appends, usage reports and
    compactions all go through here. Every request also carries the reply's
    priming, which the provider counts in its prompt (and the calibration
    compares against), so it is overhead too."""
    return budget.Accounting(
        context_tokens=session.context_tokens,
        calibration_factor=session.calibration_factor,
        overhead_tokens=session.overhead_tokens + REPLY_PRIMING_TOKENS,
        reported_prompt_tokens=session.reported_prompt_tokens,
        context_tokens_at_report=session.context_tokens_at_report,
    )


def verdict_of(session: Budgeted, config: SessionConfig | None = None) -> budget.Verdict:
    """The verdict from the session's totals; ``config`` when the caller has it already."""
    window, _ = window_of(session)
    config = config or effective_config(session.config)
    return budget.verdict(accounting_of(session), window, thresholds_of(config))


def auto_compaction_state(session: Session, config: SessionConfig) -> str:
    """Whether automatic compaction would run now, and if not, why."""
    if not (config.compaction.enabled and config.compaction.auto):
        return "off"
    if session.compaction_failures >= relief.FAILURE_LIMIT:
        return "stopped"
    held = session.compaction_held_seq
    if held is not None and session.next_seq <= held:
        return "held"
    return "on"


def to_schema(session: Session) -> SessionOut:
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
        metadata=session.metadata_,
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


def encode_cursor(session: Session) -> str:
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
    """Sessions of one tenant."""

    def __init__(self, db: AsyncSession, tenant_id: str) -> None:
        self.db = db
        self.repo = SessionRepository(db, tenant_id)
        self.tenant_id = tenant_id

    async def require(self, session_id: str, *, for_update: bool = False) -> Session:
        session = await self.repo.get(session_id, for_update=for_update)
        if session is None:
            raise NotFound(f"session {session_id!r} does not exist")
        return session

    async def create(self, body: SessionCreate) -> Session:
        effective_config(body.config)
        session_id = body.id or f"ses_{uuid.uuid4().hex}"
        if await self.repo.get(session_id) is not None:
            raise Conflict(f"session {session_id!r} already exists")
        if body.parent_id is not None and await self.repo.get(body.parent_id) is None:
            # The body names what does not exist (the route does): 422, naming the field.
            raise invalid(
                "parent_id",
                f"session {body.parent_id!r} does not exist: parent_id names a session of "
                "the same tenant",
            )
        # A new family, stored under the session's id, unless a family still stores
        # entries under it (a session of that id was deleted while a fork of it lives).
        family_id = session_id
        taken = await self.db.execute(
            select(Branch.branch_id)
            .where(Branch.session_id == session_id, Branch.tenant_id == self.tenant_id)
            .limit(1)
        )
        if taken.first() is not None:
            family_id = f"fam_{uuid.uuid4().hex}"
        session = Session(
            id=session_id,
            tenant_id=self.tenant_id,
            family_id=family_id,
            parent_id=body.parent_id,
            path_branches=[tree.ROOT_BRANCH],
            path_ends=[],
            model=body.model,
            context_window=body.context_window,
            max_output_tokens=body.max_output_tokens,
            input_limit=body.input_limit,
            config=body.config,
            metadata_=body.metadata,
            version=1,
            next_seq=1,
            entry_count=0,
            stored_tokens=0,
            context_tokens=0,
            context_tool_tokens=0,
            context_start_seq=1,
            calibration_factor=1.0,
            overhead_tokens=0,
            compaction_count=0,
            pruned_tokens=0,
            prune_count=0,
            usage_count=0,
        )
        try:
            async with self.db.begin_nested():
                await self.repo.add(session)
                self.db.add(
                    Branch(
                        session_id=family_id,
                        tenant_id=self.tenant_id,
                        branch_id=tree.ROOT_BRANCH,
                        owner_id=session_id,
                        parent_branch=None,
                        fork_seq=0,
                        path_branches=[tree.ROOT_BRANCH],
                        path_ends=[],
                    )
                )
                await self.db.flush()
        except IntegrityError as exc:
            if "session_parent_id_tenant_id_fkey" in str(exc.orig):  # deleted meanwhile
                raise NotFound(f"session {body.parent_id!r} does not exist") from None
            # a concurrent create with the same id won
            raise Conflict(f"session {session_id!r} already exists") from None
        await self.db.refresh(session)
        return session

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
        rows = await self.repo.list(
            limit=limit + 1, after=after, metadata=metadata, parent_id=parent_id
        )
        page = rows[:limit]
        return SessionPage(
            sessions=[to_schema(s) for s in page],
            next_cursor=encode_cursor(page[-1]) if len(rows) > limit else None,
        )

    async def patch(self, session_id: str, body: SessionPatch, if_match: str | None) -> Session:
        session = await self.require(session_id, for_update=True)
        check_if_match(if_match, session.version)
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
            session.metadata_ = body.metadata or {}
        # New config, new pruning rules: the next append or report looks again.
        advance(session, ledger.Patched(config="config" in fields))
        session.updated_at = datetime.now(UTC)
        await self.db.flush()
        return session

    async def delete(self, session_id: str, if_match: str | None) -> None:
        """The session and all of its data. Its children (``parent_id``) are kept, their
        ``parent_id`` set to null by the database (``ON DELETE SET NULL``)."""
        session = await self.require(session_id, for_update=True)
        check_if_match(if_match, session.version)
        await self.repo.delete(session_id, session.family_id)
