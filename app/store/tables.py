"""The tables of the storage floor: ``session`` (one row per conversation, with
its running totals), the message log (``entry``, ``prune_mark``,
``tool_call``, ``idempotency_record``) and the summarizer's spend per tenant
(``tenant_summarizer_usage``, ``tenant_summarizer_hour``). The compaction queue's table is
:mod:`app.compactions.models`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    Float,
    ForeignKeyConstraint,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base


class Session(Base):
    __tablename__ = "session"
    __table_args__ = (
        Index("session_tenant_id_created_at_idx", "tenant_id", "created_at", "id"),
        Index("session_family_idx", "family_id", "tenant_id"),
        Index(
            "session_metadata_idx",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
        # A parent's children, in creation order (GET /v1/sessions?parent_id=).
        Index(
            "session_parent_idx",
            "tenant_id",
            "parent_id",
            "created_at",
            "id",
            postgresql_where=text("parent_id IS NOT NULL"),
        ),
        # A deleted parent's children stay, parentless: only parent_id is set null (the
        # key's tenant_id stays). Postgres 15's column list, which the migration (0012)
        # writes out: SQLAlchemy's own DDL would refuse it, and none is made from here.
        ForeignKeyConstraint(
            ["parent_id", "tenant_id"],
            ["session.id", "session.tenant_id"],
            ondelete="SET NULL (parent_id)",
        ),
    )

    # session_id leads every key, so the schema can be distributed by session.
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # The family's root session: where its entries are stored (migration 0009).
    family_id: Mapped[str] = mapped_column(String(128))
    # The session this one is a side conversation of (a title request, a subagent:
    # app.proxy.conversations), in the same tenant; null once that one is deleted.
    parent_id: Mapped[str | None] = mapped_column(String(128))
    # The path from the root to the active leaf (app.engine.tree.Path).
    path_branches: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), default=lambda: [0], server_default="{0}"
    )
    path_ends: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), default=list, server_default="{}"
    )
    model: Mapped[str] = mapped_column(Text)
    context_window: Mapped[int | None] = mapped_column(Integer)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    input_limit: Mapped[int | None] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    version: Mapped[int] = mapped_column(BigInteger, default=1)
    next_seq: Mapped[int] = mapped_column(BigInteger, default=1)
    entry_count: Mapped[int] = mapped_column(BigInteger, default=0)
    stored_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    context_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    context_tool_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    context_start_seq: Mapped[int] = mapped_column(BigInteger, default=1)
    calibration_factor: Mapped[float] = mapped_column(Float, default=1.0)
    overhead_tokens: Mapped[int] = mapped_column(Integer, default=0)
    last_usage: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    reported_prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    context_tokens_at_report: Mapped[int | None] = mapped_column(BigInteger)
    compaction_count: Mapped[int] = mapped_column(Integer, default=0)
    pruned_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    prune_count: Mapped[int] = mapped_column(Integer, default=0)
    prune_checked_tool_tokens: Mapped[int | None] = mapped_column(BigInteger)
    prune_checked_urgent: Mapped[bool | None] = mapped_column(Boolean)
    usage_count: Mapped[int] = mapped_column(Integer, default=0)
    summary_seq: Mapped[int | None] = mapped_column(BigInteger)
    pinned_seqs: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), default=list, server_default="{}"
    )
    active_compaction_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    compaction_failures: Mapped[int] = mapped_column(Integer, default=0)
    compaction_held_seq: Mapped[int | None] = mapped_column(BigInteger)
    pivot_version: Mapped[int | None] = mapped_column(BigInteger)
    # The last context GET /context served and no usage report has measured yet:
    # its version, its context_tokens, and the compaction active then. A report
    # without context_version is about that context (see app.budget.service).
    served_version: Mapped[int | None] = mapped_column(BigInteger)
    served_context_tokens: Mapped[int | None] = mapped_column(BigInteger)
    served_compaction_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # What compaction cost (the summarizer's usage, its compactions and branch summaries)
    # and what it saved (context tokens removed), added as each one commits (0013).
    summarizer_calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    summarizer_input_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    summarizer_output_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    summarizer_cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    compaction_saved_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class TenantSummarizerUsage(Base):
    """A tenant's summarizer usage and compactions' savings, summed as each compaction
    commits (app.store.spend): keyed by tenant, a small reference table like
    ``api_key``."""

    __tablename__ = "tenant_summarizer_usage"

    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    input_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    compactions: Mapped[int] = mapped_column(BigInteger, server_default="0")
    saved_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Compactions the hourly spend limit sent to the extractive summarizer.
    limited_compactions: Mapped[int] = mapped_column(BigInteger, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class TenantSummarizerHour(Base):
    """A tenant's summarizer usage in one hour (``hour_start``, UTC): what the spend
    limit reads. Rows older than a week are deleted as new ones are written."""

    __tablename__ = "tenant_summarizer_hour"

    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    hour_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    input_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    limited_compactions: Mapped[int] = mapped_column(BigInteger, server_default="0")


class Entry(Base):
    """One stored entry of a session's history: a message, or (later) a
    compaction or branch summary. Rows are appended, never rewritten (pruning
    adds a ``PruneMark``), unless a session asks pruning to erase content."""

    __tablename__ = "entry"
    __table_args__ = (
        # No foreign key to the session (migration 0009): a family's entries outlive
        # its root session while a fork still reaches them.
        UniqueConstraint("session_id", "tenant_id", "id"),
        # The entries marked pinned, so an append that pins sums them without a pass
        # over the session (migration 0008).
        Index(
            "entry_pinned_idx",
            "session_id",
            "tenant_id",
            "branch",
            "seq",
            postgresql_where=text("pinned"),
        ),
        # The compactions on a path: where a navigation finds the pivot it lands on.
        Index(
            "entry_compaction_idx",
            "session_id",
            "tenant_id",
            "branch",
            "seq",
            postgresql_where=text("kind = 'compaction'"),
        ),
        # An entry's children, for the tree's counts.
        Index("entry_parent_idx", "session_id", "tenant_id", "parent_branch", "parent_seq"),
        # Recall (migration 0010): words and trigrams, each led by the family's key.
        Index(
            "entry_search_tsv_idx", "session_id", "tenant_id", "search_tsv", postgresql_using="gin"
        ),
        Index(
            "entry_search_text_idx",
            "session_id",
            "tenant_id",
            "search_text",
            postgresql_using="gin",
            postgresql_ops={"search_text": "gin_trgm_ops"},
        ),
        # The entries whose searchable text the worker has yet to write (app.store.search_index).
        Index(
            "entry_search_pending_idx",
            "session_id",
            "tenant_id",
            "branch",
            "seq",
            postgresql_where=text("search_pending"),
        ),
    )

    # session_id is the family's root session (the session's own id unless it is a
    # fork); seq is the entry's depth on its path; branch holds the run of seqs.
    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    branch: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default="0")
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    kind: Mapped[str] = mapped_column(String(32), default="message")
    role: Mapped[str] = mapped_column(String(16))
    parts: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    tool_name: Mapped[str | None] = mapped_column(Text)
    is_error: Mapped[bool] = mapped_column(Boolean, default=False)
    name: Mapped[str | None] = mapped_column(Text)
    content_form: Mapped[str] = mapped_column(String(8))
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    source_format: Mapped[str] = mapped_column(String(16))
    tokens: Mapped[int] = mapped_column(Integer)
    # Rendered once on write (see app.engine.window.view): a context read splices these.
    call_ids: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    view_openai: Mapped[str] = mapped_column(Text)
    view_anthropic: Mapped[str] = mapped_column(Text)
    parent_seq: Mapped[int | None] = mapped_column(BigInteger)
    parent_branch: Mapped[int | None] = mapped_column(BigInteger)
    # The stored tokens of the path from the root up to this entry.
    path_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # A summary entry's compaction (its session and id).
    job_session_id: Mapped[str | None] = mapped_column(String(128))
    job_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # A summary entry's pivot: the window's first seq after it, the entries kept before.
    pivot_start: Mapped[int | None] = mapped_column(BigInteger)
    pivot_pinned: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    erased_bytes: Mapped[int | None] = mapped_column(
        Integer
    )  # stored content cleared (prune.erase)
    view_call_id: Mapped[str | None] = mapped_column(Text)  # a result's call, as the view names it
    call_id_tokens: Mapped[int | None] = mapped_column(Integer)  # its tokens in the view
    omitted_lines: Mapped[int | None] = mapped_column(Integer)  # ingest truncation of the view
    omitted_bytes: Mapped[int | None] = mapped_column(Integer)
    # Marked on append: never summarized, kept in the context like a system entry.
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # What recall searches (app.engine.search_text), and its words: read by search only,
    # never loaded with the entry.
    search_text: Mapped[str] = mapped_column(
        Text, server_default="", deferred=True, deferred_raiseload=True
    )
    search_tsv: Mapped[Any] = mapped_column(
        TSVECTOR,
        Computed(
            "to_tsvector('english'::regconfig, replace(replace(search_text, '.', ' '), '/', ' '))",
            persisted=True,
        ),
        deferred=True,
        deferred_raiseload=True,
    )
    # Its search_text is still to write: an append indexes a bounded amount of text
    # itself and leaves the rest to the worker (app.store.search_index).
    search_pending: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false(), deferred=True, deferred_raiseload=True
    )


class PruneMark(Base):
    """A tool output hidden from the model by pruning; the entry itself stays."""

    __tablename__ = "prune_mark"
    # No foreign key (see migration 0002): the session's delete removes its marks.

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    branch: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default="0")
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    pruned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    tokens: Mapped[int] = mapped_column(Integer)  # what the placeholder takes in the view


class ToolCall(Base):
    """Every tool call of a session, so a result can be checked against its call
    in one indexed lookup, and answered at most once. An id may be used again
    by a later call; a result answers the latest call with its id."""

    __tablename__ = "tool_call"
    # Keyed by the family's root session, like the entries; no foreign key (0009).

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    call_id: Mapped[str] = mapped_column(Text, primary_key=True)
    # The branch the row answers on: the call's, or a branch that forked after the
    # call and before its answer (its own row, so each path answers it once).
    branch: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default="0")
    name: Mapped[str] = mapped_column(Text)
    call_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    result_seq: Mapped[int | None] = mapped_column(BigInteger)
    result_branch: Mapped[int | None] = mapped_column(BigInteger)
    view_id: Mapped[str | None] = mapped_column(Text)  # the model's id for a reused call id


class IdempotencyRecord(Base):
    """The first response to an append made with an ``Idempotency-Key``."""

    __tablename__ = "idempotency_record"
    __table_args__ = (
        ForeignKeyConstraint(
            ["session_id", "tenant_id"], ["session.id", "session.tenant_id"], ondelete="CASCADE"
        ),
        Index("idempotency_record_created_at_idx", "created_at"),
    )

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(SmallInteger)
    response: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


__all__ = ["Entry", "IdempotencyRecord", "Integer", "PruneMark", "ToolCall"]


class Branch(Base):
    """A run of consecutive seqs of a family's tree, and the path that leads to it
    (app.engine.tree). Written by one session (``owner_id``); made by a navigation
    or a fork, branch 0 by the family's root session."""

    __tablename__ = "branch"

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # the family's root
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    branch_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(128))
    parent_branch: Mapped[int | None] = mapped_column(BigInteger)
    fork_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    path_branches: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    path_ends: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Event(Base):
    """A session's event (app.store.events): read in (txid, id) order."""

    __tablename__ = "event"
    __table_args__ = (
        Index("event_tenant_idx", "tenant_id", "txid", "id"),
        Index("event_created_at_idx", "created_at"),
    )

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    txid: Mapped[int] = mapped_column(
        BigInteger, primary_key=True, server_default=text("(pg_current_xact_id()::text)::bigint")
    )
    id: Mapped[int] = mapped_column(
        BigInteger, primary_key=True, server_default=text("nextval('event_id_seq')")
    )
    type: Mapped[str] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Webhook(Base):
    """A tenant's subscription to its events, or a blocking hook (``hook``)."""

    __tablename__ = "webhook"

    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(Text)
    types: Mapped[list[str]] = mapped_column(ARRAY(Text))
    session_id: Mapped[str | None] = mapped_column(String(128))
    hook: Mapped[bool] = mapped_column(Boolean, server_default=false())
    timeout_seconds: Mapped[float] = mapped_column(Float)
    description: Mapped[str | None] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    failures: Mapped[int] = mapped_column(Integer, server_default="0")
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class WebhookDelivery(Base):
    """One event sent (or to send) to one webhook: the delivery log."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        Index(
            "webhook_delivery_due_idx",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("webhook_delivery_log_idx", "tenant_id", "webhook_id", "created_at"),
    )

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    webhook_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    event_id: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
