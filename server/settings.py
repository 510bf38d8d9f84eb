"""The server's configuration: one pydantic-settings class, `INFERENCE_AUCTION_*` variables.

It extends the ledger's settings, so `INFERENCE_AUCTION_DATABASE_URL` and the ledger's job
intervals are server settings too. Every field can also be set by a `serve` option.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from billing.settings import LedgerSettings


class ServerSettings(LedgerSettings):
    """Everything `inference-auction serve` reads."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model_name: str = "inference-auction-emulated"

    # Engine: a real SGLang server, or the embedded emulator when no URL is given.
    engine_url: str | None = None
    engine_mode: Literal["priority", "ordered"] = "priority"
    # A generation that produces no token for `engine_stall_timeout_seconds` (none at all, or
    # none since the last) is cut off and fails: 504, refunded. A generation that keeps
    # streaming is never cut off by it. `engine_max_seconds`, when set, caps a generation's
    # whole time: one that reaches it is cut off and *served* with the output so far
    # (finish_reason `abort`, as SGLang reports an aborted request), and charged.
    engine_stall_timeout_seconds: float = Field(default=600.0, gt=0)
    engine_max_seconds: float | None = Field(default=None, gt=0)
    emulator_cache_tokens: int = Field(default=23_000, gt=0)
    emulator_time_scale: float = Field(default=1.0, gt=0)

    # Batching: a batch closes at `batch_size` waiting requests or `max_wait_ms` after the
    # oldest arrived, and only while fewer than `max_inflight` requests are at the engine.
    batch_size: int = Field(default=64, ge=1, le=100_000)
    max_wait_ms: float = Field(default=50.0, ge=0)
    max_inflight: int = Field(default=256, ge=1)
    max_queue: int = Field(default=10_000, ge=1)

    # Input limits: anything above them is a 4xx that names the limit.
    max_bid_credits: int = Field(default=1_000, ge=0)
    max_prompt_tokens: int = Field(default=131_072, ge=1)
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    max_new_tokens_limit: int = Field(default=32_768, ge=1)

    # Per-key rate limit (token bucket): sustained requests per second and burst.
    rate_limit_per_second: float = Field(default=200.0, gt=0)
    rate_limit_burst: int = Field(default=400, ge=1)

    # The ledger's periodic jobs (period rollover, stale holds, reconciliation).
    run_jobs: bool = True
