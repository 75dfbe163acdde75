"""Pruning marks, ingest truncation and usage reports.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # An entry's ``tokens`` is what it takes in the model's view as written (after
    # ingest truncation); a pruned entry takes ``pruned_tokens`` (its placeholder).
    op.add_column("entry", sa.Column("pruned_tokens", sa.Integer(), nullable=True))
    op.add_column("entry", sa.Column("erased_bytes", sa.Integer(), nullable=True))
    op.add_column("entry", sa.Column("omitted_lines", sa.Integer(), nullable=True))
    op.add_column("entry", sa.Column("omitted_bytes", sa.Integer(), nullable=True))
    op.add_column(
        "session",
        sa.Column("pruned_tokens", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.add_column(
        "session", sa.Column("prune_count", sa.Integer(), server_default="0", nullable=False)
    )
    # context_tool_tokens when automatic pruning last looked: it looks again only
    # once enough new tool output could have left the protected window.
    op.add_column(
        "session", sa.Column("prune_checked_tool_tokens", sa.BigInteger(), nullable=True)
    )
    op.add_column(
        "session", sa.Column("usage_count", sa.Integer(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    for column in ("usage_count", "prune_checked_tool_tokens", "prune_count", "pruned_tokens"):
        op.drop_column("session", column)
    for column in ("omitted_bytes", "omitted_lines", "erased_bytes", "pruned_tokens"):
        op.drop_column("entry", column)
