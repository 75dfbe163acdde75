"""Conversations an agent did not plan as one (issue 28).

- ``session.parent_id``: the session another one is a side conversation of (a title
  request, a subagent: app.proxy.conversations), in the same tenant. Deleting the
  parent keeps its children, their ``parent_id`` set to null (``ON DELETE SET NULL
  (parent_id)``, Postgres 15: the tenant column of the key is left as it is). Read by
  tenant and parent, in creation order (``GET /v1/sessions?parent_id=``).
- ``proxy_history.tools_declared``: whether a proxied call on the session declared
  tools; a conversation that came only from calls that declared none, one exchange
  long, is provisional (it gives way to the agent's real conversation).

Revision ID: 0012
Revises: 0011
Create Date: 2027-01-05
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("session", sa.Column("parent_id", sa.String(128), nullable=True))
    # SQLAlchemy's DDL has no column list for SET NULL: written out.
    op.execute(
        "ALTER TABLE session ADD CONSTRAINT session_parent_id_tenant_id_fkey"
        " FOREIGN KEY (parent_id, tenant_id) REFERENCES session (id, tenant_id)"
        " ON DELETE SET NULL (parent_id)"
    )
    op.create_index(
        "session_parent_idx",
        "session",
        ["tenant_id", "parent_id", "created_at", "id"],
        postgresql_where=sa.text("parent_id IS NOT NULL"),
    )
    op.add_column(
        "proxy_history",
        sa.Column("tools_declared", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("proxy_history", "tools_declared")
    op.drop_index("session_parent_idx", table_name="session")
    op.drop_constraint("session_parent_id_tenant_id_fkey", "session", type_="foreignkey")
    op.drop_column("session", "parent_id")
