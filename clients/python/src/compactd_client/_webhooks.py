"""Checking a webhook delivery's signature (docs/events.md, "Verifying a delivery")."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"


def verify_webhook(
    secret: str, headers: Mapping[str, str], body: bytes, tolerance: float = 300
) -> bool:
    """Whether a compactd delivery (or hook call) is genuine: signed with ``secret``
    (the ``whsec_...`` that ``create_webhook`` answered) and sent within ``tolerance``
    seconds of now. ``headers`` are the request's (any case), ``body`` its raw bytes as
    received, before any parsing.

    This is the Standard Webhooks check: ``webhook-signature`` holds ``v1,<base64>``,
    the HMAC-SHA256 of ``"<webhook-id>.<webhook-timestamp>.<body>"`` keyed with the
    secret's base64 part. A request without those headers, or with a timestamp that is
    not a number, is not genuine."""
    named = {name.lower(): value for name, value in headers.items()}
    message_id = named.get("webhook-id")
    timestamp = named.get("webhook-timestamp")
    signatures = named.get("webhook-signature")
    if message_id is None or timestamp is None or signatures is None:
        return False
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(time.time() - sent_at) > tolerance:
        return False
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    # Compared as bytes: compare_digest refuses a str that is not ASCII (a forgery's).
    return any(
        hmac.compare_digest(expected, candidate.split(",", 1)[1].encode())
        for candidate in signatures.split()
        if candidate.startswith("v1,")
    )
