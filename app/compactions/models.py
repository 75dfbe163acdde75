"""The ``compaction`` table: the job queue and the record the API returns, in one."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base

ACTIVE = ("queued", "running")


class Compaction(Base):
    __tablename__ = "compaction"
    __table_args__ = (
        ForeignKeyConstraint(
            ["session_id", "tenant_id"], ["session.id", "session.tenant_id"], ondelete="CASCADE"
        ),
        Index(
            "compaction_active_key",
            "session_id",
            "tenant_id",
            unique=True,
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
        Index(
            "compaction_session_id_tenant_id_created_at_idx",
            "session_id",
            "tenant_id",
            "created_at",
        ),
        Index("compaction_queued_idx", "run_after", postgresql_where=text("status = 'queued'")),
        Index(
            "compaction_running_idx",
            "lease_expires_at",
            postgresql_where=text("status = 'running'"),
        ),
    )

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(16))
    auto: Mapped[bool] = mapped_column(Boolean)
    strategy: Mapped[str] = mapped_column(String(16))
    summarizer: Mapped[str] = mapped_column(String(16))
    summarizer_used: Mapped[str | None] = mapped_column(String(16))
    model: Mapped[str | None] = mapped_column(Text)
    instructions: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    run_after: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default="false")
    tokens_before: Mapped[int | None] = mapped_column(BigInteger)
    tokens_after: Mapped[int | None] = mapped_column(BigInteger)
    summary: Mapped[str | None] = mapped_column(Text)
    short_summary: Mapped[str | None] = mapped_column(Text)
    source_start_seq: Mapped[int | None] = mapped_column(BigInteger)
    first_kept_seq: Mapped[int | None] = mapped_column(BigInteger)
    entry_seq: Mapped[int | None] = mapped_column(BigInteger)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    upstream_model: Mapped[str | None] = mapped_column(Text)
    upstream_usage: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Requests sent to the summarizer, failed ones included (0013).
    summarizer_calls: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
