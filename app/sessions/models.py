"""The ``session`` table: one row per conversation, with its running totals."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Float, Index, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base

DEFAULT_TENANT = "default"


class Session(Base):
    __tablename__ = "session"
    __table_args__ = (
        Index("session_tenant_id_created_at_idx", "tenant_id", "created_at", "id"),
        Index(
            "session_metadata_idx",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
    )

    # session_id leads every key, so the schema can be distributed by session.
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
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
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
