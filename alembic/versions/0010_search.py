"""Recall: every entry's searchable text, its full-text vector and their indexes.

- ``entry.search_text``: the entry's plain text (its text parts, readable reasoning,
  tool calls' names and arguments, tool outputs), bounded and NUL-free, computed on
  write by app.engine.search_text. Existing rows get an SQL approximation of it
  (arguments as their raw JSON, the same bounds).
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

# app.engine.search_text's bounds: the first 16,000 and the last 4,000 characters.
_BACKFILL_SQL = """
UPDATE entry SET search_text = coalesce((
    SELECT CASE WHEN length(body) <= 16003 + 4000 THEN body
        ELSE left(body, 16000) || E'\\n…\\n' || right(body, 4000) END
    FROM (
        SELECT string_agg(piece, E'\\n' ORDER BY n) AS body FROM (
            SELECT n, CASE p->>'type'
                WHEN 'text' THEN p->>'text'
                WHEN 'reasoning' THEN p->>'text'
                WHEN 'tool_call' THEN concat_ws(E'\\n', p->>'name', p->>'arguments')
                END AS piece
            FROM jsonb_array_elements(parts) WITH ORDINALITY AS a(p, n)
        ) AS pieces
        WHERE piece <> ''
    ) AS joined
), '')
"""

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
    op.execute(_BACKFILL_SQL)
    # Added after the back-fill, so that the table is rewritten once for the vector.
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


def downgrade() -> None:
    op.drop_index("entry_search_text_idx", table_name="entry")
    op.drop_index("entry_search_tsv_idx", table_name="entry")
    op.drop_column("entry", "search_tsv")
    op.drop_column("entry", "search_text")
    # The extensions stay: something else in the database may use them.
