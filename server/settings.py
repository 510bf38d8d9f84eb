"""The server's configuration: one pydantic-settings class, `INFERENCE_AUCTION_*` variables.

It extends the ledger's settings, so `INFERENCE_AUCTION_DATABASE_URL` and the ledger's job
intervals are server settings too. Every field can also be set by a `serve` option.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from inference_auctions.billing import LedgerSettings, mask_database_url


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
    # A request whose client waits for the whole answer is still streamed from the engine (to
    # see its first token), but with one chunk per this many tokens (SGLang's per-request
    # `stream_interval`) rather than one per token. The stall deadline then sees progress
    # every this many tokens, and an answer cut off by `engine_max_seconds` ends at the last
    # chunk: keep it small enough that the engine produces this many tokens well within the
    # stall timeout.
    engine_stream_interval: int = Field(default=64, ge=1)
    # Who tokenizes prompts for an engine URL (server.engine.local_tokenizer): `engine` (its
    # `/tokenize`, one round trip per new prompt), `builtin` (this project's tokenizer, which
    # the emulator serves), or the path of the served model's `tokenizer.json` (or its folder;
    # needs the `tokenizers` extra). A local one is checked against the engine's before use.
    # The embedded emulator always tokenizes with the builtin one.
    tokenizer: str = Field(default="engine", min_length=1)
    emulator_cache_tokens: int = Field(default=23_000, gt=0)
    emulator_time_scale: float = Field(default=1.0, gt=0)

    # In-step prefix deferral (server.deferral): hold back a request sharing at least
    # `deferral_tokens` uncached prompt tokens with an earlier request of its batch that has no
    # first token yet, until it has one or `deferral_max_hold_ms` passed. Priority mode only.
    deferral: bool = True
    deferral_tokens: int = Field(default=32, ge=1)
    deferral_max_hold_ms: float = Field(default=60_000.0, ge=0)

    # Batching is work-conserving (server.batching): while the engine can take more, a batch
    # closes at once with whatever waits, up to `batch_size`; while it is saturated, requests
    # wait here and the next batch auctions the whole backlog. Saturated: the requests sent to
    # the engine that have no first token yet (queued there, prefilling, or held back by the
    # prefix deferral) add up to `saturation_tokens` prompt tokens (about one prefill step:
    # SGLang's default chunked prefill size is 8192) or to `saturation_requests` requests.
    # Counting prompt tokens, cached ones included, errs on the side of holding back; the
    # request count bounds what short prompts can queue at the engine. `max_wait_ms` is an
    # optional collection window while the engine is free: a batch then closes only once
    # `batch_size` requests wait or the oldest has waited that long (0: at once).
    # `max_inflight` caps the requests outstanding at the engine, started or not.
    batch_size: int = Field(default=64, ge=1, le=100_000)
    max_wait_ms: float = Field(default=0.0, ge=0)
    max_inflight: int = Field(default=256, ge=1)
    saturation_tokens: int = Field(default=8_192, ge=1)
    saturation_requests: int = Field(default=32, ge=1)
    max_queue: int = Field(default=10_000, ge=1)
    # Memory for answers (server.answer_memory): each request in flight reserves what its
    # `max_new_tokens` can hold, finished answers kept for retries count at their size; a
    # request that cannot fit is refused with 503 and Retry-After (kept answers go first).
    answer_memory_mib: int = Field(default=2_048, ge=1)
    # Shares of the engine (server.engine_shares): zero-bid requests together hold at most
    # `zero_bid_share` of the `max_inflight` slots and of the engine's tokens; while others
    # wait, one user gets no more once it holds `user_share`. `engine_tokens`: the engine's KV
    # capacity in tokens (default: the embedded emulator's cache; unset for an engine URL, the
    # shares count slots only).
    zero_bid_share: float = Field(default=0.5, gt=0, le=1)
    user_share: float = Field(default=0.5, gt=0, le=1)
    engine_tokens: int | None = Field(default=None, ge=1)

    # Dispatch ahead of the commit (server.speculation): a batch of at most
    # `dispatch_ahead_max_batch` requests, all of whose users could afford their queued bids
    # when the ledger last committed, goes to the engine while its settlement commits; no byte
    # of an answer leaves before that commit, and a batch it cannot settle whole is cancelled
    # at the engine and cleared again. Off: every batch waits for its commit first.
    dispatch_ahead: bool = True
    dispatch_ahead_max_batch: int = Field(default=64, ge=1)

    # The serving path's group commits run on threads of the server (server.ledger_lanes).
    # `process` (a writer process of their own) was removed: it is refused by name.
    ledger_writer: Literal["thread"] = "thread"

    @field_validator("ledger_writer", mode="before")
    @classmethod
    def _writer_removed(cls, value: object) -> object:
        if value == "process":
            raise ValueError(
                "the process ledger writer was removed: the ledger's group commits run on "
                "threads of the server (ledger_writer 'thread', the default); drop the option"
            )
        return value

    # Input limits: anything above them is a 4xx that names the limit.
    max_bid_credits: int = Field(default=1_000, ge=0)
    max_prompt_tokens: int = Field(default=131_072, ge=1)
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    max_new_tokens_limit: int = Field(default=32_768, ge=1)
    # Hostile bodies: refused by name before any recursive walk or costly validation.
    max_json_depth: int = Field(default=32, ge=2, le=500)
    max_logit_bias_entries: int = Field(default=4_096, ge=0)
    max_custom_params_bytes: int = Field(default=65_536, ge=0)

    # Connections: a request whose headers and body have not all arrived this long after its
    # first byte (or after the connection opened) is cut off; above `max_connections` open
    # connections, a new one is answered 503 and closed at once.
    http_read_timeout_seconds: float = Field(default=30.0, gt=0)
    # A connection whose client takes none of its waiting answer for this long is dropped
    # (a stream nobody reads); its request counts as left by its client.
    http_write_timeout_seconds: float = Field(default=30.0, gt=0)
    # One client address may hold at most this share of `max_connections`; a trusted proxy's
    # addresses (SMG, a load balancer) are exempt, its clients told apart by their keys.
    connection_share_per_client: float = Field(default=0.25, gt=0, le=1)
    trusted_proxies: list[str] = Field(default_factory=list)
    max_connections: int = Field(default=2_048, ge=1)

    # Per-key rate limit (token bucket): sustained requests per second and burst, for the
    # whole deployment; each of `rate_limit_replicas` replicas enforces its equal share.
    rate_limit_per_second: float = Field(default=200.0, gt=0)
    rate_limit_burst: int = Field(default=400, ge=1)
    rate_limit_replicas: int = Field(default=1, ge=1, le=1024)

    # This replica's name on its health, responses and (only when set) metrics; by default
    # host:port.
    replica_name: str | None = Field(default=None, min_length=1, max_length=128)

    # The ledger's periodic jobs (period rollover, stale holds, reconciliation); with the
    # election, only the replica holding a PostgreSQL advisory lock runs them.
    run_jobs: bool = True
    jobs_leader_election: bool = False


def without_password(url: str) -> str:
    """The database URL with its password masked, for logs and the console."""
    return mask_database_url(url)
