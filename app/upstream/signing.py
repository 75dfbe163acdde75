"""Signed webhook requests, the Standard Webhooks way (https://www.standardwebhooks.com,
as Svix and others send them; Stripe's scheme is the same idea).

Every request carries three headers:

- ``webhook-id``: the message's id (a delivery's event id; the same on every retry,
  so a receiver can drop duplicates);
- ``webhook-timestamp``: the Unix time it was signed (a receiver refuses old ones);
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256>`` of ``"<id>.<timestamp>.<body>"``
  with the webhook's secret (``whsec_<base64 key>``: the key is the decoded part).

docs/events.md has the receiver's check, and the tests run it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import httpx

SECRET_PREFIX = "whsec_"
# How much of an answer is read (a hook's JSON, whose summary may hold 200,000
# characters of any script; a delivery's body is only logged).
MAX_ANSWER_BYTES = 1024 * 1024


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, message_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {
        "content-type": "application/json",
        "user-agent": "compactd-webhooks",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body),
    }


@dataclass(frozen=True, slots=True)
class Sent:
    """What came back: a status and the start of the body, or the error that stopped it."""

    status: int | None
    body: bytes
    error: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


async def post(
    http: httpx.AsyncClient,
    url: str,
    secret: str,
    message_id: str,
    body: bytes,
    timeout_seconds: float,
) -> Sent:
    """POST ``body`` signed; never raises for the receiver's failures (a status, a
    timeout, a refused connection): they are in the answer."""
    started = time.perf_counter()
    try:
        async with (
            asyncio.timeout(timeout_seconds),
            http.stream(
                "POST",
                url,
                content=body,
                headers=headers(secret, message_id, body),
                timeout=httpx.Timeout(timeout_seconds),
                follow_redirects=False,
            ) as response,
        ):
            read = bytearray()
            async for chunk in response.aiter_bytes():
                read += chunk
                if len(read) >= MAX_ANSWER_BYTES:
                    break
            return Sent(
                response.status_code,
                bytes(read[:MAX_ANSWER_BYTES]),
                None,
                time.perf_counter() - started,
            )
    except (httpx.TimeoutException, TimeoutError):
        error = f"no answer within {timeout_seconds:g} s"
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:
        # InvalidURL and UnicodeError (a host IDNA refuses) are not HTTPErrors: a
        # URL the client cannot send to fails the attempt, it does not raise.
        error = f"{type(exc).__name__}: {exc}"[:500]
    return Sent(None, b"", error, time.perf_counter() - started)
