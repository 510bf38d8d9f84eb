"""Configuration of the ledger, read from `INFERENCE_AUCTION_*` environment variables.

The server's settings subclass `LedgerSettings`, so every field here is also a server setting.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class LedgerSettings(BaseSettings):
    """Where the ledger lives and how often its periodic jobs run."""

    model_config = SettingsConfigDict(env_prefix="INFERENCE_AUCTION_", extra="ignore")

    # A file in the working directory: the embedded default needs nothing started.
    database_url: str = "sqlite:///inference-auction.db"
    # A hold older than this belongs to a request that never reached a batch; expiry frees it.
    hold_max_age_seconds: float = Field(default=3600.0, gt=0)
    rollover_interval_seconds: float = Field(default=60.0, gt=0)
    hold_expiry_interval_seconds: float = Field(default=60.0, gt=0)
    reconcile_interval_seconds: float = Field(default=3600.0, gt=0)
    # PostgreSQL with autovacuum off only: how often the ledger analyzes its tables that have
    # grown (`billing.table_statistics`); short, because the check is one cheap query.
    statistics_interval_seconds: float = Field(default=10.0, gt=0)
