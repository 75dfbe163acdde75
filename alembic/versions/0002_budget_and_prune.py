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
    # Pruning adds marks, one small row per hidden output, instead of rewriting
    # the wide entry rows: a prune of thousands of outputs stays an insert. An
    # entry's ``tokens`` is what it takes in the model's view as written (after
    # ingest truncation); a marked entry takes the mark's ``tokens`` (its placeholder).
    op.create_table(
        "prune_mark",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        # No foreign key: a mark is written only for an entry read in the same
        # transaction, under the session's row lock, and deleting a session
        # deletes its marks (app.store.session_row). A key check per mark was
        # most of the cost of a large prune (seconds against the entry table when
        # its statistics lagged, tens of ms against the session).
        sa.PrimaryKeyConstraint("session_id", "tenant_id", "seq", name="prune_mark_pkey"),
    )
    op.drop_column("entry", "pruned_at")  # never written: the marks replace it
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
    op.add_column("session", sa.Column("prune_checked_tool_tokens", sa.BigInteger(), nullable=True))
    # Whether that look was urgent (turns unprotected): an escalation looks again.
    op.add_column("session", sa.Column("prune_checked_urgent", sa.Boolean(), nullable=True))
    op.add_column(
        "session", sa.Column("usage_count", sa.Integer(), server_default="0", nullable=False)
    )
    # A call id may come back in a later turn (some providers number calls per
    # turn: call_0, call_1...): one row per call, the latest answering. Its
    # ``view_id`` is the unique id the model's view gives a reused id.
    op.drop_constraint("tool_call_pkey", "tool_call", type_="primary")
    op.create_primary_key(
        "tool_call_pkey", "tool_call", ["session_id", "tenant_id", "call_id", "call_seq"]
    )
    op.add_column("tool_call", sa.Column("view_id", sa.Text(), nullable=True))
    # A tool result's call as the model's view names it, when not its own id.
    op.add_column("entry", sa.Column("view_call_id", sa.Text(), nullable=True))
    # What a result's call id costs in its view: pruning prices placeholders
    # without counting thousands of ids again.
    op.add_column("entry", sa.Column("call_id_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("entry", "call_id_tokens")
    op.drop_column("entry", "view_call_id")
    op.drop_column("tool_call", "view_id")
    # Only the latest call of each id is kept: the old key allows one.
    op.execute(
        "DELETE FROM tool_call AS t USING tool_call AS newer"
        " WHERE newer.session_id = t.session_id AND newer.tenant_id = t.tenant_id"
        " AND newer.call_id = t.call_id AND newer.call_seq > t.call_seq"
    )
    op.drop_constraint("tool_call_pkey", "tool_call", type_="primary")
    op.create_primary_key("tool_call_pkey", "tool_call", ["session_id", "tenant_id", "call_id"])
    for column in (
        "usage_count",
        "prune_checked_urgent",
        "prune_checked_tool_tokens",
        "prune_count",
        "pruned_tokens",
    ):
        op.drop_column("session", column)
    for column in ("omitted_bytes", "omitted_lines", "erased_bytes"):
        op.drop_column("entry", column)
    op.add_column("entry", sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_table("prune_mark")
