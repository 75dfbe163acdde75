"""The last context served: which context a usage report without
``context_version`` measured.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Set by GET /context, cleared by the usage report that measures it.
    op.add_column("session", sa.Column("served_version", sa.BigInteger(), nullable=True))
    op.add_column("session", sa.Column("served_context_tokens", sa.BigInteger(), nullable=True))
    op.add_column("session", sa.Column("served_compaction_id", UUID(as_uuid=True), nullable=True))


def downgrade() -> None:
    op.drop_column("session", "served_compaction_id")
    op.drop_column("session", "served_context_tokens")
    op.drop_column("session", "served_version")
