"""API keys: high-entropy random tokens, stored only as a SHA-256 hash beside a lookup prefix.

A key reads `iak_<prefix>_<secret>`. The prefix is not secret: it finds the row, and the hash
of the whole key is compared in constant time. A slow password hash is unnecessary because the
secret carries 256 random bits.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

_SCHEME = "iak_"
PREFIX_LENGTH = 12


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly generated key: `key` is shown once; only `prefix` and `digest` are stored."""

    key: str
    prefix: str
    digest: str


def generate_key() -> NewKey:
    """Make a new random API key."""
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    key = f"{_SCHEME}{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(key=key, prefix=prefix, digest=hash_key(key))


def hash_key(key: str) -> str:
    """Hex SHA-256 of the whole key."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_prefix(key: str) -> str | None:
    """The lookup prefix of a well-formed key, or None."""
    if not key.startswith(_SCHEME) or len(key) < len(_SCHEME) + PREFIX_LENGTH + 2:
        return None
    prefix = key[len(_SCHEME) : len(_SCHEME) + PREFIX_LENGTH]
    if key[len(_SCHEME) + PREFIX_LENGTH] != "_":
        return None
    return prefix


def matches(key: str, digest: str) -> bool:
    """Whether `key` hashes to `digest`, compared in constant time."""
    return hmac.compare_digest(hash_key(key), digest)
