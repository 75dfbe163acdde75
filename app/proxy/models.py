"""The ``proxy_history`` table (see migration 0006): what the proxy knows of each
session's stored history, so that a call finds its new messages without reading it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKeyConstraint,
    LargeBinary,
    String,
    false,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.core.database import Base


class ProxyHistory(Base):
    __tablename__ = "proxy_history"
    __table_args__ = (
        ForeignKeyConstraint(
            ["session_id", "tenant_id"], ["session.id", "session.tenant_id"], ondelete="CASCADE"
        ),
    )

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    entry_count: Mapped[int] = mapped_column(BigInteger)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    chain: Mapped[bytes] = mapped_column(LargeBinary)
    raw_count: Mapped[int] = mapped_column(BigInteger)
    raw_digest: Mapped[bytes | None] = mapped_column(LargeBinary)
    raw_entry_count: Mapped[int] = mapped_column(BigInteger)
    raw_chain: Mapped[bytes] = mapped_column(LargeBinary)
    # Whether a call on the session declared tools (migration 0012): a conversation
    # of calls that declared none is provisional (app.proxy.conversations).
    tools_declared: Mapped[bool] = mapped_column(Boolean, server_default=false())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
