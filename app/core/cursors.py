"""Keyset cursors of (created_at, id) pages, newest first (the compactions, a webhook's
deliveries): opaque to clients, and refused with a 422 when not one this API issued."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

from app.core.errors import invalid


def encode(created_at: datetime, row_id: uuid.UUID) -> str:
    raw = f"{created_at.isoformat()}|{row_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) a cursor holds; 422 naming ``cursor`` otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, row_id = raw.split("|")
        after = datetime.fromisoformat(created)
        if after.tzinfo is None:
            raise ValueError("not an issued cursor")
        # In UTC here, where an instant outside years 1-9999 (year 1 at +14:00)
        # is an OverflowError, not in the driver, where it was a 500.
        return after.astimezone(UTC), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise invalid("cursor", "is not a cursor this API returned") from None
