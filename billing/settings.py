"""Configuration of the ledger, read from `INFERENCE_AUCTION_*` environment variables.

The server's settings subclass `LedgerSettings`, so every field here is also a server setting.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class LedgerSettings(BaseSettings):
    """Where the ledger lives and how often its periodic jobs run."""

    # The docstring under each field is its description: `docs/reference/configuration.md` is
    # generated from them (tools/reference_docs.py).
    model_config = SettingsConfigDict(
        env_prefix="INFERENCE_AUCTION_", extra="ignore", use_attribute_docstrings=True
    )

    # A file in the working directory: the embedded default needs nothing started.
    database_url: str = "sqlite:///inference-auction.db"
    """The ledger's database: `sqlite:///path.db` or `postgresql+psycopg://user@host/db`."""
    # A hold older than this belongs to a request that never reached a batch; expiry frees it.
    hold_max_age_seconds: float = Field(default=3600.0, gt=0)
    """A hold older than this belongs to a request that never reached a batch; expiry frees it."""
    rollover_interval_seconds: float = Field(default=60.0, gt=0)
    """How often idle users' new budget periods are opened."""
    hold_expiry_interval_seconds: float = Field(default=60.0, gt=0)
    """How often stale holds are expired."""
    reconcile_interval_seconds: float = Field(default=3600.0, gt=0)
    """How often balances are reconciled against the entries."""
