"""The API key of an `Authorization: Bearer <key>` header, read one way everywhere.

Authentication (`api.deps.current_user`) and the per-key connection share
(`api.connections`) must agree on which headers name one key: the scheme in any case, the key
without the spaces around it. Were the share to count the raw header, `Bearer K`, `bearer K`
and `BEARER  K` would be one user with three shares.
"""

from __future__ import annotations

__all__ = ["bearer_key"]


def bearer_key(header: str) -> str | None:
    """The key a `Bearer` header carries, None if the header is not of that form."""
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return key
