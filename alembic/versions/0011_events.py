"""Events and webhooks.

- ``event``: every session's durable event log (app.store.events). ``txid`` is the
  writing transaction's id and ``id`` a sequence: readers order by both and read only
  what transactions older than every running one wrote, so a reader that resumes
  after an event never misses one that commits later with a smaller id. Keyed by the
  session first, like every per-session table; read by tenant through its own index.
- ``webhook``: a tenant's subscriptions (a small table every node reads, like
  ``api_key``), optionally scoped to one session; ``hook`` marks a blocking hook.
- ``webhook_delivery``: one row per event and subscription, written with the event,
  claimed by the dispatcher like a job (``FOR UPDATE SKIP LOCKED``), retried with
  backoff; the delivery log.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE event_id_seq")
    op.create_table(
        "event",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column(
            "txid",
            sa.BigInteger(),
            server_default=sa.text("(pg_current_xact_id()::text)::bigint"),
            nullable=False,
        ),
        sa.Column(
            "id", sa.BigInteger(), server_default=sa.text("nextval('event_id_seq')"), nullable=False
        ),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("data", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("session_id", "tenant_id", "txid", "id"),
    )
    op.create_index("event_tenant_idx", "event", ["tenant_id", "txid", "id"])
    op.create_index("event_created_at_idx", "event", ["created_at"])
    op.create_table(
        "webhook",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("hook", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("timeout_seconds", sa.Float(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id"),
    )
    op.create_table(
        "webhook_delivery",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("webhook_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("session_id", "tenant_id", "id"),
    )
    op.create_index(
        "webhook_delivery_due_idx",
        "webhook_delivery",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "webhook_delivery_log_idx", "webhook_delivery", ["tenant_id", "webhook_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_table("webhook_delivery")
    op.drop_table("webhook")
    op.drop_table("event")
    op.execute("DROP SEQUENCE event_id_seq")
