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
    # SQLAlchemy's pool of connections to the database, per process: `pool_size` kept open,
    # `max_overflow` more opened at a peak and closed after. The serving path writes from one
    # thread (`server.ledger_writer`), so a few are enough; what a process may open in all,
    # times its replicas, must stay under PostgreSQL's `max_connections` (or PgBouncer's pool).
    database_pool_size: int = Field(default=5, ge=1, le=1000)
    """Connections to the ledger's database each server keeps open (SQLAlchemy's `pool_size`)."""
    database_max_overflow: int = Field(default=10, ge=0, le=1000)
    """Connections opened beyond `database_pool_size` at a peak, closed when returned
    (SQLAlchemy's `max_overflow`)."""
