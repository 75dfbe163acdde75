"""The proxy's record of each session's stored history: the chain of its message
entries' canonical digests, and the raw digest of the agent's last request, so that a
proxied call finds its new messages without reading the history (app.engine.proxy.history).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "proxy_history",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        # The chain over the session's first entry_count message entries, the last of
        # which is last_seq (compaction entries are not the agent's: left out).
        sa.Column("entry_count", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("chain", sa.LargeBinary(), nullable=False),
        # The agent's last request: the digest of its first raw_count history messages
        # as it serialized them, which made raw_entry_count entries chained as raw_chain.
        sa.Column("raw_count", sa.BigInteger(), nullable=False),
        sa.Column("raw_digest", sa.LargeBinary(), nullable=True),
        sa.Column("raw_entry_count", sa.BigInteger(), nullable=False),
        sa.Column("raw_chain", sa.LargeBinary(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("session_id", "tenant_id", name="proxy_history_pkey"),
        sa.ForeignKeyConstraint(
            ["session_id", "tenant_id"],
            ["session.id", "session.tenant_id"],
            name="proxy_history_session_id_tenant_id_fkey",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("proxy_history")
