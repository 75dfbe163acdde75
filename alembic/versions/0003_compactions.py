"""Compactions: the job queue that is also the archive's index, and the pivot.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # One row per compaction: the worker's queue (status, run_after, lease) and
    # the record the API returns. session_id leads every key.
    op.create_table(
        "compaction",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("auto", sa.Boolean(), nullable=False),
        sa.Column("strategy", sa.String(16), nullable=False),
        sa.Column("summarizer", sa.String(16), nullable=False),
        sa.Column("summarizer_used", sa.String(16), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("run_after", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("tokens_before", sa.BigInteger(), nullable=True),
        sa.Column("tokens_after", sa.BigInteger(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("short_summary", sa.Text(), nullable=True),
        # The entries it replaced: start_seq <= seq < first_kept_seq, messages only.
        sa.Column("source_start_seq", sa.BigInteger(), nullable=True),
        sa.Column("first_kept_seq", sa.BigInteger(), nullable=True),
        sa.Column("entry_seq", sa.BigInteger(), nullable=True),  # its entry in the log
        sa.Column("details", postgresql.JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("upstream_model", sa.Text(), nullable=True),
        sa.Column("upstream_usage", postgresql.JSONB(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id", "tenant_id"],
            ["session.id", "session.tenant_id"],
            name="compaction_session_id_tenant_id_fkey",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "tenant_id", "id", name="compaction_pkey"),
    )
    # At most one queued or running compaction per session: a second request
    # finds the first through this key.
    op.create_index(
        "compaction_active_key",
        "compaction",
        ["session_id", "tenant_id"],
        unique=True,
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )
    op.create_index(
        "compaction_session_id_tenant_id_created_at_idx",
        "compaction",
        ["session_id", "tenant_id", "created_at"],
    )
    # What the claim reads: due queued jobs, and running ones whose lease ended.
    op.create_index(
        "compaction_queued_idx",
        "compaction",
        ["run_after"],
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "compaction_running_idx",
        "compaction",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
    )
    # The pivot: the latest compaction entry, and the system entries before the
    # cut that the context keeps (they are never summarized).
    op.add_column("session", sa.Column("summary_seq", sa.BigInteger(), nullable=True))
    op.add_column(
        "session",
        sa.Column(
            "pinned_seqs",
            postgresql.ARRAY(sa.BigInteger()),
            server_default="{}",
            nullable=False,
        ),
    )
    op.add_column(
        "session", sa.Column("active_compaction_id", postgresql.UUID(as_uuid=True), nullable=True)
    )
    # Loop guards: consecutive failed automatic compactions, and the next_seq
    # below which a low-yield compaction holds automatic ones back.
    op.add_column(
        "session",
        sa.Column("compaction_failures", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("session", sa.Column("compaction_held_seq", sa.BigInteger(), nullable=True))
    # The session's version when its pivot last moved: a usage report or a
    # provider error about a context read before it measures a context that is
    # gone, and must neither calibrate nor trigger anything.
    op.add_column("session", sa.Column("pivot_version", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("session", "pivot_version")
    op.drop_column("session", "compaction_held_seq")
    op.drop_column("session", "compaction_failures")
    op.drop_column("session", "active_compaction_id")
    op.drop_column("session", "pinned_seqs")
    op.drop_column("session", "summary_seq")
    op.drop_table("compaction")
