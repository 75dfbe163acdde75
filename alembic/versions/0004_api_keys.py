"""API keys: each acts for one tenant; only a hash of the secret is stored.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_key",
        # The public part of the key (it appears in the key itself, in logs and in
        # `compactd keys list`); the secret part is stored only as its SHA-256.
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("secret_sha256", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="api_key_pkey"),
    )
    op.create_index("api_key_tenant_id_idx", "api_key", ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_index("api_key_tenant_id_idx", table_name="api_key")
    op.drop_table("api_key")
