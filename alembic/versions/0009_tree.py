"""The history is a tree (app.engine.tree): entries are stored in branches, and a
session follows a path of branch segments from the root to its active leaf.

- ``entry.branch``: the branch that holds the entry; ``seq`` stays its depth on
  its path, so the key becomes (session_id, tenant_id, branch, seq).
  ``parent_branch`` (with ``parent_seq``) names the parent entry; ``path_tokens``
  is the stored tokens of the path up to the entry, so that a navigation or a
  fork knows what its new path holds without a walk.
- Forks share storage: a family of sessions (a session and the forks made from
  it, and from those) keeps its entries and tool calls under the family's root
  session id, in the ``session_id`` column, which stays the leading key: a
  family is one distribution key on Citus, co-located. ``session.family_id`` names
  it. So deleting one session of a family must not cascade to the entries: the
  foreign keys from ``entry`` and ``tool_call`` to ``session`` go, and the delete
  removes what no other session of the family reaches (app.store.session_row).
- ``branch``: one row per branch, with the path that leads to it, the session
  that writes it and where it forks; ids from one sequence.
- ``tool_call.branch`` / ``result_branch``: where a call and its answer are,
  so that a call answered on one branch may be answered again on another.
- ``prune_mark.branch``: marks stay the session's own (a fork has its own), keyed
  by the entry they hide.

Existing sessions become families of one, on branch 0.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-16
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIGINTS = postgresql.ARRAY(sa.BigInteger())


def upgrade() -> None:
    op.add_column("session", sa.Column("family_id", sa.String(128), nullable=True))
    op.execute("UPDATE session SET family_id = id")
    op.alter_column("session", "family_id", nullable=False)
    op.add_column(
        "session",
        sa.Column("path_branches", _BIGINTS, server_default="{0}", nullable=False),
    )
    op.add_column("session", sa.Column("path_ends", _BIGINTS, server_default="{}", nullable=False))
    op.create_index("session_family_idx", "session", ["family_id", "tenant_id"])

    op.execute("CREATE SEQUENCE branch_id_seq START 1")
    op.create_table(
        "branch",
        sa.Column("session_id", sa.String(128), nullable=False),  # the family's root
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("branch_id", sa.BigInteger(), nullable=False),
        sa.Column("owner_id", sa.String(128), nullable=False),  # the session writing it
        sa.Column("parent_branch", sa.BigInteger(), nullable=True),
        sa.Column("fork_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("path_branches", _BIGINTS, nullable=False),
        sa.Column("path_ends", _BIGINTS, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("session_id", "tenant_id", "branch_id", name="branch_pkey"),
    )
    op.execute(
        "INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch,"
        " fork_seq, path_branches, path_ends, created_at)"
        " SELECT id, tenant_id, 0, id, NULL, 0, '{0}', '{}', created_at FROM session"
    )

    op.drop_constraint("entry_session_id_tenant_id_fkey", "entry", type_="foreignkey")
    op.add_column("entry", sa.Column("branch", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("entry", sa.Column("parent_branch", sa.BigInteger(), nullable=True))
    op.add_column(
        "entry", sa.Column("path_tokens", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.execute("UPDATE entry SET parent_branch = 0 WHERE parent_seq IS NOT NULL")
    # The compaction that wrote a summary entry: its details are the next one's
    # "previous", found from the entry on any path (a fork's too).
    op.add_column("entry", sa.Column("job_session_id", sa.String(128), nullable=True))
    op.add_column("entry", sa.Column("job_id", postgresql.UUID(as_uuid=True), nullable=True))
    # A summary entry's pivot: where the window starts after it, the entries it keeps
    # before that (system and pinned ones), so that a navigation onto a path knows its
    # context without reading the compaction that wrote it.
    op.add_column("entry", sa.Column("pivot_start", sa.BigInteger(), nullable=True))
    op.add_column("entry", sa.Column("pivot_pinned", _BIGINTS, nullable=True))
    op.execute(
        """
        UPDATE entry AS e SET job_session_id = c.session_id, job_id = c.id
        FROM compaction AS c
        WHERE c.session_id = e.session_id AND c.tenant_id = e.tenant_id
            AND c.entry_seq = e.seq AND c.status = 'succeeded' AND e.kind = 'compaction'
        """
    )
    op.execute(
        """
        UPDATE entry AS e SET pivot_start = c.first_kept_seq
        FROM compaction AS c
        WHERE c.session_id = e.job_session_id AND c.tenant_id = e.tenant_id AND c.id = e.job_id
        """
    )
    op.execute(
        """
        UPDATE entry AS c SET pivot_pinned = coalesce((
            SELECT array_agg(e.seq ORDER BY e.seq) FROM entry AS e
            WHERE e.session_id = c.session_id AND e.tenant_id = c.tenant_id
                AND e.seq < c.pivot_start AND (e.role IN ('system', 'developer') OR e.pinned)
        ), '{}')
        WHERE c.kind = 'compaction' AND c.pivot_start IS NOT NULL
        """
    )
    op.execute(
        """
        UPDATE entry AS e SET path_tokens = c.total
        FROM (
            SELECT session_id, tenant_id, seq,
                sum(tokens) OVER (PARTITION BY session_id, tenant_id ORDER BY seq) AS total
            FROM entry
        ) AS c
        WHERE e.session_id = c.session_id AND e.tenant_id = c.tenant_id AND e.seq = c.seq
        """
    )
    op.drop_constraint("entry_pkey", "entry", type_="primary")
    op.create_primary_key("entry_pkey", "entry", ["session_id", "tenant_id", "branch", "seq"])
    op.drop_index("entry_pinned_idx", table_name="entry")
    op.create_index(
        "entry_pinned_idx",
        "entry",
        ["session_id", "tenant_id", "branch", "seq"],
        postgresql_where=sa.text("pinned"),
    )
    op.create_index(
        "entry_compaction_idx",
        "entry",
        ["session_id", "tenant_id", "branch", "seq"],
        postgresql_where=sa.text("kind = 'compaction'"),
    )
    op.create_index(
        "entry_parent_idx", "entry", ["session_id", "tenant_id", "parent_branch", "parent_seq"]
    )

    op.drop_constraint("tool_call_session_id_tenant_id_fkey", "tool_call", type_="foreignkey")
    op.add_column(
        "tool_call", sa.Column("branch", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column("tool_call", sa.Column("result_branch", sa.BigInteger(), nullable=True))
    op.execute("UPDATE tool_call SET result_branch = 0 WHERE result_seq IS NOT NULL")
    op.drop_constraint("tool_call_pkey", "tool_call", type_="primary")
    op.create_primary_key(
        "tool_call_pkey", "tool_call", ["session_id", "tenant_id", "call_id", "branch", "call_seq"]
    )

    op.add_column(
        "prune_mark", sa.Column("branch", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.drop_constraint("prune_mark_pkey", "prune_mark", type_="primary")
    op.create_primary_key(
        "prune_mark_pkey", "prune_mark", ["session_id", "tenant_id", "branch", "seq"]
    )


def downgrade() -> None:
    # Only a history that is still a line goes back: other branches are dropped.
    op.execute("DELETE FROM prune_mark WHERE branch <> 0")
    op.drop_constraint("prune_mark_pkey", "prune_mark", type_="primary")
    op.create_primary_key("prune_mark_pkey", "prune_mark", ["session_id", "tenant_id", "seq"])
    op.drop_column("prune_mark", "branch")

    op.execute("DELETE FROM tool_call WHERE branch <> 0")
    op.drop_constraint("tool_call_pkey", "tool_call", type_="primary")
    op.create_primary_key(
        "tool_call_pkey", "tool_call", ["session_id", "tenant_id", "call_id", "call_seq"]
    )
    op.drop_column("tool_call", "result_branch")
    op.drop_column("tool_call", "branch")

    op.execute("DELETE FROM entry WHERE branch <> 0")
    op.drop_index("entry_parent_idx", table_name="entry")
    op.drop_index("entry_compaction_idx", table_name="entry")
    op.drop_index("entry_pinned_idx", table_name="entry")
    op.create_index(
        "entry_pinned_idx",
        "entry",
        ["session_id", "tenant_id", "seq"],
        postgresql_where=sa.text("pinned"),
    )
    op.drop_constraint("entry_pkey", "entry", type_="primary")
    op.create_primary_key("entry_pkey", "entry", ["session_id", "tenant_id", "seq"])
    op.drop_column("entry", "path_tokens")
    op.drop_column("entry", "job_id")
    op.drop_column("entry", "pivot_pinned")
    op.drop_column("entry", "pivot_start")
    op.drop_column("entry", "job_session_id")
    op.drop_column("entry", "parent_branch")
    op.drop_column("entry", "branch")
    # Forks' entries live under their family's root: a line has none.
    op.execute("DELETE FROM session WHERE id <> family_id")
    op.execute(
        "DELETE FROM entry AS e WHERE NOT EXISTS (SELECT 1 FROM session AS s"
        " WHERE s.id = e.session_id AND s.tenant_id = e.tenant_id)"
    )
    op.execute(
        "DELETE FROM tool_call AS t WHERE NOT EXISTS (SELECT 1 FROM session AS s"
        " WHERE s.id = t.session_id AND s.tenant_id = t.tenant_id)"
    )
    op.create_foreign_key(
        "entry_session_id_tenant_id_fkey",
        "entry",
        "session",
        ["session_id", "tenant_id"],
        ["id", "tenant_id"],
        ondelete="CASCADE",
    )
    op.create_foreign_key(
        "tool_call_session_id_tenant_id_fkey",
        "tool_call",
        "session",
        ["session_id", "tenant_id"],
        ["id", "tenant_id"],
        ondelete="CASCADE",
    )

    op.drop_table("branch")
    op.execute("DROP SEQUENCE branch_id_seq")
    op.drop_index("session_family_idx", table_name="session")
    op.drop_column("session", "path_ends")
    op.drop_column("session", "path_branches")
    op.drop_column("session", "family_id")
