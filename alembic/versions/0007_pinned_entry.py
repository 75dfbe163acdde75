"""Pinned entries: a message the agent marked ``pinned`` on append is never
summarized; like a system entry, the context keeps it verbatim wherever a
compaction cuts (app.engine.compaction.prepare). A column of the entry, not a key of its
``extra`` (the client's keys the service does not interpret): the compaction's
read takes it with the entry's other columns. ``NOT NULL DEFAULT false`` is a
catalog change on Postgres 11 and later, no table rewrite; no index, as the flag
is only ever read with the rows of a session's seq range.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-14
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "entry",
        sa.Column("pinned", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("entry", "pinned")
