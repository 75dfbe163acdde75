"""An index of the entries marked pinned: an append that pins checks that the
session's pinned messages stay within a quarter of its usable window
(app.messages.service), and sums the tokens of those already pinned through this
partial index rather than a pass over the session's entries. Partial, so it holds
only the few pinned rows and costs an ordinary append nothing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-15
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "entry_pinned_idx",
        "entry",
        ["session_id", "tenant_id", "seq"],
        postgresql_where=sa.text("pinned"),
    )


def downgrade() -> None:
    op.drop_index("entry_pinned_idx", table_name="entry")
