"""Webhooks' request and response bodies."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.sessions.schemas import SESSION_ID_PATTERN
from app.store import events

# Where a blocking hook is called (app.compactions.hooks).
HOOK_POINTS = ("compaction.before", "navigation.before")


def check_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        # What the client that sends deliveries cannot send to (a port that is not a
        # number from 0 to 65535, a host that is not one) is refused here, not on
        # every attempt later.
        parts.port  # noqa: B018 - raises ValueError for a bad port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL):
        raise ValueError("must be an absolute http:// or https:// URL") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or not parts.hostname:
        raise ValueError("must be an absolute http:// or https:// URL")
    return url


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=8, max_length=2048, description="Where deliveries (or hook calls) are POSTed."
    )
    types: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="The event types delivered (`compaction.*` for a family); empty: all. For a "
        f"hook, the points it is called at ({', '.join(HOOK_POINTS)}); empty: both.",
    )
    session_id: str | None = Field(
        default=None,
        pattern=SESSION_ID_PATTERN,
        description="Only this session's events (or hook calls); default: every session's.",
    )
    hook: bool = Field(
        default=False,
        description="A blocking hook: called before a compaction or a navigation, which waits "
        "for its answer up to timeout_seconds (see docs/events.md).",
    )
    timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=30,
        description="A hook's time to answer; past it the default applies (the work goes on).",
    )
    description: str | None = Field(default=None, max_length=500)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url(value)

    def checked_types(self) -> list[str]:
        known = HOOK_POINTS if self.hook else events.TYPES
        families = {t.split(".")[0] + ".*" for t in known}
        for name in self.types:
            if name not in known and (self.hook or name not in families):
                raise ValueError(
                    f"unknown {'hook point' if self.hook else 'event type'} {name[:64]!r}; "
                    f"known: {', '.join(known)}"
                )
        return sorted(set(self.types))


class WebhookPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        description="Enable again (the failure count starts over), or disable (deliveries "
        "pending then are skipped as they come due)."
    )


class WebhookOut(BaseModel):
    id: uuid.UUID
    url: str
    types: list[str]
    session_id: str | None
    hook: bool
    timeout_seconds: float
    description: str | None
    enabled: bool
    failures: int = Field(description="Failed attempts in a row (a success resets it).")
    disabled_reason: str | None
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="The signing secret (`whsec_…`), shown once: deliveries carry "
        "`webhook-signature` made with it (docs/events.md shows the check)."
    )


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class DeliveryOut(BaseModel):
    id: uuid.UUID
    event_id: str
    type: str
    session_id: str | None
    status: Literal["pending", "succeeded", "failed", "skipped"]
    attempts: int
    last_status: int | None = Field(description="The receiver's last HTTP status.")
    last_error: str | None
    last_attempt_at: datetime | None
    next_attempt_at: datetime | None = Field(description="When a pending one is tried again.")
    created_at: datetime
    payload: dict[str, Any]


class DeliveryPage(BaseModel):
    deliveries: list[DeliveryOut]
    next_cursor: str | None
