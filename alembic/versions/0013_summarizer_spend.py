"""What compaction costs and saves (issue 30, "cost accounted").

- ``compaction.summarizer_calls``: the requests the job sent to its summarizer
  (``upstream_usage`` stays the usage as the upstream reported it).
- ``session``: the summarizer's usage summed over the session's compactions and
  branch summaries (``summarizer_calls``, ``summarizer_input_tokens``,
  ``summarizer_output_tokens``, ``summarizer_cached_tokens``) and the context tokens
  its committed compactions removed (``compaction_saved_tokens``), added when each
  one commits, in its transaction: a read never sums the history.
- ``tenant_summarizer_usage``: the same sums per tenant, and how many compactions
  the spend limit sent to the extractive summarizer (``limited_compactions``).
- ``tenant_summarizer_hour``: the same per tenant and hour (``hour_start``, the hour's
  first instant in UTC): what the spend limit
  (``COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR``) reads. Hours older than a week
  are deleted as new ones are written.

Both tenant tables are keyed by tenant, not by session: small reference tables,
like ``api_key``.

Revision ID: 0013
Revises: 0012
Create Date: 2027-01-12
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SESSION_COLUMNS = (
    "summarizer_calls",
    "summarizer_input_tokens",
    "summarizer_output_tokens",
    "summarizer_cached_tokens",
    "compaction_saved_tokens",
)
_SUMS = ("calls", "input_tokens", "output_tokens", "cached_tokens")


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    op.add_column(
        "compaction",
        sa.Column("summarizer_calls", sa.Integer(), server_default="0", nullable=False),
    )
    for name in _SESSION_COLUMNS:
        op.add_column("session", _counter(name))
    op.create_table(
        "tenant_summarizer_usage",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        *(_counter(name) for name in _SUMS),
        _counter("compactions"),
        _counter("saved_tokens"),
        _counter("limited_compactions"),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tenant_id", name="tenant_summarizer_usage_pkey"),
    )
    op.create_table(
        "tenant_summarizer_hour",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        *(_counter(name) for name in _SUMS),
        _counter("limited_compactions"),
        sa.PrimaryKeyConstraint("tenant_id", "hour_start", name="tenant_summarizer_hour_pkey"),
    )


def downgrade() -> None:
    op.drop_table("tenant_summarizer_hour")
    op.drop_table("tenant_summarizer_usage")
    for name in reversed(_SESSION_COLUMNS):
        op.drop_column("session", name)
    op.drop_column("compaction", "summarizer_calls")
