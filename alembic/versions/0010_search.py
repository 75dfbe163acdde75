"""Recall: every entry's searchable text, its full-text vector and their indexes.

- ``entry.search_text``: the entry's plain text (its text parts, readable reasoning,
  tool calls' names and arguments, tool outputs), bounded and NUL-free, computed on
  write by app.engine.search_text.
- ``entry.search_pending``: its search_text is still to write. Existing rows read
  true (a column default, so no rewrite here): the worker's indexer
  (app.store.search_index) computes their text as an append would, in small batches,
  after the upgrade. An append sets it on what it leaves to the indexer.
- ``entry.search_tsv``: generated from it, stored: its ``english`` words (stems:
  "failing" finds "failed"), paths and dotted names split in their parts.
- Two GIN indexes, both led by the family's key through ``btree_gin``: one on the
  vector, one of trigrams (``pg_trgm``) on the text, for substrings and near matches
  of identifiers, paths and error names the parser keeps whole or splits
  (``src/dates.py``, ``parse_iso_week``, ``django.core.exceptions.ImproperlyConfigured``).
  A search is always within one family: with its key in the index, a common word or
  trigram costs the family's share of its posting list, not every tenant's.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-20
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The parser keeps a path or a dotted name as one token (``src/dates.py``,
# ``django.core.exceptions.ImproperlyConfigured``): the vector is of the text with its
# dots and slashes made spaces, so that their parts are words of their own; the whole
# token is found as written through the trigram index. One english vector: a simple
# one beside it (words unstemmed, stop words kept) doubled the cost of a write and
# added little that stems and trigrams do not find.
TSV = "to_tsvector('english'::regconfig, replace(replace(search_text, '.', ' '), '/', ' '))"


def upgrade() -> None:
    # Both are trusted extensions (PostgreSQL 13+): a database owner may create them.
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    op.add_column("entry", sa.Column("search_text", sa.Text(), server_default="", nullable=False))
    # Every existing row is to index; every new one is written indexed unless said.
    op.add_column(
        "entry", sa.Column("search_pending", sa.Boolean(), server_default="true", nullable=False)
    )
    op.alter_column("entry", "search_pending", server_default=sa.false())
    op.execute(
        f"ALTER TABLE entry ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS ({TSV}) STORED"
    )
    op.execute(
        "CREATE INDEX entry_search_tsv_idx ON entry USING gin (session_id, tenant_id, search_tsv)"
    )
    op.execute(
        "CREATE INDEX entry_search_text_idx ON entry"
        " USING gin (session_id, tenant_id, search_text gin_trgm_ops)"
    )
    op.execute(
        "CREATE INDEX entry_search_pending_idx ON entry (session_id, tenant_id, branch, seq)"
        " WHERE search_pending"
    )


def downgrade() -> None:
    op.drop_index("entry_search_pending_idx", table_name="entry")
    op.drop_index("entry_search_text_idx", table_name="entry")
    op.drop_index("entry_search_tsv_idx", table_name="entry")
    op.drop_column("entry", "search_tsv")
    op.drop_column("entry", "search_pending")
    op.drop_column("entry", "search_text")
    # The extensions stay: something else in the database may use them.
