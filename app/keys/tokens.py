"""The shape of an API key, pure: ``cpd_<id>_<secret>``.

The id (12 hex characters) is public: it names the key in logs and listings and
finds its row. The secret (32 random bytes, URL-safe base64) is shown once, at
creation, and stored only as the SHA-256 of ``<id>:<secret>``. A fast hash is
right here: the secret is 256 random bits, not a password, so there is nothing to
brute-force, and verifying costs a microsecond on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "cpd_"
_KEY = re.compile(r"cpd_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@dataclass(frozen=True, slots=True)
class NewKey:
    id: str
    secret_sha256: bytes
    token: str  # the whole key, shown once


def digest(key_id: str, secret: str) -> bytes:
    return hashlib.sha256(f"{key_id}:{secret}".encode()).digest()


def generate() -> NewKey:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewKey(key_id, digest(key_id, secret), f"{PREFIX}{key_id}_{secret}")


def parse(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else None."""
    match = _KEY.fullmatch(token)
    return (match.group(1), match.group(2)) if match else None


def matches(secret_sha256: bytes, key_id: str, secret: str) -> bool:
    """Constant-time: how much of the digest matches leaks nothing."""
    return hmac.compare_digest(secret_sha256, digest(key_id, secret))


def valid_tenant(name: str) -> bool:
    return re.fullmatch(TENANT_PATTERN, name) is not None
