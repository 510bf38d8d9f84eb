"""Defaults shared by both clients."""

from __future__ import annotations

from typing import Final

import httpx

BASE_URL_ENV: Final = "INFERENCE_AUCTION_BASE_URL"
API_KEY_ENV: Final = "INFERENCE_AUCTION_API_KEY"

# Generation can legitimately take minutes; a dead host should fail fast.
DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=5.0)
DEFAULT_MAX_RETRIES: Final = 2

INITIAL_RETRY_DELAY: Final = 0.5
MAX_RETRY_DELAY: Final = 8.0
# A server asking for a longer pause than this is treated as not having asked.
MAX_RETRY_AFTER: Final = 60.0

MICROS_PER_CREDIT: Final = 1_000_000
# Ledger pages are fetched this many rows at a time when syncing spend.
LEDGER_PAGE_SIZE: Final = 500
# `info` logs retries and pacing warnings, `debug` every request too (see `sdk._logs`).
LOG_ENV: Final = "INFERENCE_AUCTION_LOG"
# Pacing re-reads the user's ledger-wide spend at least this often (seconds).
DEFAULT_SYNC_INTERVAL: Final = 2.0
