"""The server's configuration: one pydantic-settings class, `INFERENCE_AUCTION_*` variables.

It extends the ledger's settings, so `INFERENCE_AUCTION_DATABASE_URL` and the ledger's job
intervals are server settings too. Every field can also be set by a `serve` option.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from inference_auctions.billing import LedgerSettings, mask_database_url
from inference_auctions.server.serving.tiers import TierMenu, parse_tiers

if TYPE_CHECKING:  # the auction core (numpy) loads only where batches are cleared
    from inference_auctions.server.auction.charges import PricingRule


# The model name the embedded emulator serves under unless `model_name` is set.
EMULATED_MODEL_NAME = "inference-auction-emulated"


class ServerSettings(LedgerSettings):
    """Everything `inference-auction serve` reads."""

    host: str = "127.0.0.1"
    """Interface to listen on; `0.0.0.0` listens on every interface."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port to listen on; `serve` refuses a busy port and says so."""
    # The `model` of answers and `/v1/models`: by default the engine's own (SGLang's
    # `served_model_name`, else its `model_path`, read again whenever the engine restarts), or
    # `inference-auction-emulated` for the embedded emulator. OpenAI requests naming another
    # model are answered 404 `model_not_found`, as OpenAI answers them.
    model_name: str | None = Field(default=None, min_length=1)
    """The model name in answers and `/v1/models` (default: the engine's served model name, or
    `inference-auction-emulated` for the embedded emulator)."""

    # Engine: a real SGLang server, or the embedded emulator when no URL is given.
    engine_url: str | None = None
    """A real SGLang server (`http://host:30000`); unset, the embedded emulator serves."""
    # SGLang started with `--api-key` wants `Authorization: Bearer <key>` on every request; the
    # key is a secret: never logged, never shown in an error or on the console.
    engine_api_key: SecretStr | None = None
    """The API key of an SGLang server started with `--api-key` (sent as a bearer token)."""
    # An `https://` engine URL is checked against the system's certificate authorities, or
    # against this bundle (a PEM file) for an engine whose certificate a private CA signed.
    engine_ca_bundle: str | None = Field(default=None, min_length=1)
    """A PEM file of the certificate authorities an `https://` engine URL is checked against
    (default: the system's)."""
    engine_mode: Literal["priority", "ordered"] = "priority"
    """`priority`: SGLang started with `--enable-priority-scheduling --schedule-low-priority-
    values-first` keeps the auction's order; `ordered`: a batch is sent one request at a time."""
    # A generation that produces no token for `engine_stall_timeout_seconds` (none at all, or
    # none since the last) is cut off and fails: 504, refunded. A generation that keeps
    # streaming is never cut off by it. `engine_max_seconds`, when set, caps a generation's
    # whole time: one that reaches it is cut off and *served* with the output so far
    # (finish_reason `abort`, as SGLang reports an aborted request), and charged.
    engine_stall_timeout_seconds: float = Field(default=600.0, gt=0)
    """A generation that produces no token for this long fails with 504 and is refunded."""
    engine_max_seconds: float | None = Field(default=None, gt=0)
    """Optional cap on a generation's whole time: it is then served with its output so far
    (`finish_reason` `abort`) and charged."""
    # A request whose client waits for the whole answer is still streamed from the engine (to
    # see its first token), but with one chunk per this many tokens (SGLang's per-request
    # `stream_interval`) rather than one per token. The stall deadline then sees progress
    # every this many tokens, and an answer cut off by `engine_max_seconds` ends at the last
    # chunk: keep it small enough that the engine produces this many tokens well within the
    # stall timeout.
    engine_stream_interval: int = Field(default=64, ge=1)
    """Tokens per chunk when the engine streams an answer the client waits for whole (SGLang's
    `stream_interval`)."""
    # Who tokenizes prompts for an engine URL (server.engine.local_tokenizer): `auto` (the
    # engine's own tokenizer files and chat template, from the `tokenizer_path` of its
    # `/model_info`, when this host can read them; else its `/tokenize`, the reason logged
    # once), `engine` (its `/tokenize`, one round trip per new prompt), `builtin` (this
    # project's tokenizer, which the emulator serves), or the path of the served model's
    # `tokenizer.json` (or its folder; needs the `tokenizers` extra). A local one is checked
    # against the engine's before use. The embedded emulator always tokenizes with the builtin
    # one.
    tokenizer: str = Field(default="auto", min_length=1)
    """Who tokenizes prompts for `engine_url`: `auto` (the engine's tokenizer files when
    readable here, else its `/tokenize`), `engine` (its `/tokenize`), `builtin` (the
    emulator's), or the path of the model's `tokenizer.json`."""
    # A prompt's token ids must be below the model's vocabulary size: one above it kills
    # SGLang's scheduler. Learnt from the engine (server.engine.vocabulary) unless set here.
    engine_vocab_size: int | None = Field(default=None, ge=1)
    """The model's vocabulary size, for an engine URL whose model the server cannot learn it
    from (default: learnt from the engine's `/model_info`, its model folder, or the local
    tokenizer); token ids at or above it are refused at admission."""
    emulator_cache_tokens: int = Field(default=23_000, gt=0)
    """The embedded emulator's KV cache size, in tokens."""
    emulator_max_running_requests: int | None = Field(default=None, ge=1)
    """The embedded emulator's cap on running requests, as SGLang's `--max-running-requests`
    (default: none; its KV cache bounds them)."""
    emulator_time_scale: float = Field(default=1.0, gt=0)
    """The emulator's wall-clock seconds per model second (0.01 runs 100x faster)."""

    # In-step prefix deferral (server.serving.deferral): hold back a request sharing at least
    # `deferral_tokens` uncached prompt tokens with an earlier request of its batch that has no
    # first token yet, until it has one or `deferral_max_hold_ms` passed. Priority mode only.
    deferral: bool = True
    """Hold back a request while an earlier one of its batch computes their shared prefix (priority
    mode)."""
    deferral_tokens: int = Field(default=32, ge=1)
    """Shared uncached prompt tokens that make a request wait for the earlier one."""
    deferral_max_hold_ms: float = Field(default=60_000.0, ge=0)
    """The longest a request is held back by the deferral."""

    # Batching is work-conserving (server.serving.pool): while the engine can take more, a batch
    # closes at once with whatever waits, up to `batch_size`; while it is saturated, requests
    # wait here and the next batch auctions the whole backlog. Saturated
    # (server.serving.pool): the requests sent to the engine that have no first token yet
    # (queued there, prefilling, or held back by the prefix deferral) are what the engine can
    # admit at its next step. By default that is learnt from the engine: its running-request
    # limit less this server's requests running there, and one prefill chunk of prompt tokens
    # (`/server_info`), and any waiting queue of its own (`/v1/loads`, polled every
    # `engine_poll_ms` while requests are outstanding). `saturation_tokens` and
    # `saturation_requests`, when set, override what the engine says. `max_wait_ms` is an
    # optional collection window while the engine is free: a batch then closes only once
    # `batch_size` requests wait or the oldest has waited that long (0: at once).
    # `max_inflight` caps the requests outstanding at the engine, started or not.
    batch_size: int = Field(default=64, ge=1, le=100_000)
    """The most requests one batch (one auction) takes."""
    # How batches are formed (server.serving.selection): `rolling` auctions the whole waiting
    # pool at every engine opening and sends the engine only the head it can start at its next
    # step (plus `dispatch_lookahead` requests), so a later, higher bid overtakes everything
    # still waiting; `batches` takes the oldest waiting requests whatever they bid and sends
    # them whole (the behaviour before the rolling auction, kept for comparison).
    scheduling: Literal["rolling", "batches"] = "rolling"
    """`rolling`: auction the whole waiting pool at every engine opening and send only what the
    engine can start; `batches`: the oldest waiting requests, sent whole (the default under
    `pricing_rule batch-size`, which prices whole batches)."""
    free_traffic: Literal["idle", "shared"] = "idle"
    """Under `rolling`: `idle` sends free requests (zero bids, a free tier) only while no paying
    request is at the engine, whose decoding their prefills would stall, and preempts one still
    there when a paying request comes (it resumes later from where it was); `shared` lets them
    take what the bidders leave, within `zero_bid_share`."""
    clearing_log: Path | None = None
    """Under `rolling`: append every clearing's pool (rids, users, bids, tree paths), head and
    charges to this file as JSON lines, to price them again offline (off by default)."""
    # The posted price floor (docs/SPEC.md section 7, "The price floor"): under `posted` only
    # bids at or above it enter the rolling auction; it moves after every clearing towards
    # keeping `price_floor_target` entrants in the pool (by default what the engine can start
    # at its next step). Each replica keeps its own. On by default under the rolling auction
    # (the timing study chose it, docs/RESULTS.md "Timing"); ignored by the other modes unless
    # asked for by name.
    price_floor: Literal["off", "posted"] = "posted"
    """Under the rolling auction: `posted` (the default) admits to the auction only bids at or
    above a floor that moves with the pool's depth, and charges it to the entrants sent; it
    rests at 0 while the engine keeps up. `off`: none."""
    price_floor_target: int | None = Field(default=None, ge=1, le=100_000)
    """The entrants the floor aims at (default: what the engine can start at its next step)."""
    price_floor_start: int = Field(default=0, ge=0, le=1_000_000_000_000)
    """The floor's level at start, in micro-credits (0: it rises from nothing once the pool
    holds more entrants than its target)."""
    dispatch_lookahead: int = Field(default=0, ge=0, le=1_000)
    """Under `rolling`: requests sent beyond what the engine can start at its next step."""
    max_wait_ms: float = Field(default=0.0, ge=0)
    """Optional collection window while the engine is not saturated: a batch closes once
    `batch_size` requests wait or the oldest waited this long (0: at once)."""
    max_inflight: int = Field(default=256, ge=1)
    """Hard cap on requests outstanding at the engine, started or not."""
    saturation_tokens: int | None = Field(default=None, ge=1)
    """The engine counts as saturated, and requests wait for the next auction, while the requests
    sent to it without a first token hold this many prompt tokens (default: learned from the
    engine, its chunked prefill size)."""
    saturation_requests: int | None = Field(default=None, ge=1)
    """...or while this many requests sent to it have no first token (default: learned from the
    engine, its free running slots)."""
    engine_poll_ms: float = Field(default=100.0, gt=0)
    """How often the engine's waiting queue (`/v1/loads`) is read while requests are there."""
    max_queue: int = Field(default=10_000, ge=1)
    """The most requests waiting for a batch; beyond it new ones are answered 503."""
    # Memory for answers (server.serving.admission): each request in flight reserves what its
    # `max_new_tokens` can hold, finished answers kept for retries count at their size; a
    # request that cannot fit is refused with 503 and Retry-After (kept answers go first).
    answer_memory_mib: int = Field(default=2_048, ge=1)
    """Memory for answers in flight and kept for retries; a request that cannot fit is 503."""
    # Shares of the engine (server.serving.pool): zero-bid requests together hold at most
    # `zero_bid_share` of the `max_inflight` slots and of the engine's tokens; while others
    # wait, one user gets no more once it holds `user_share`. `engine_tokens`: the engine's KV
    # capacity in tokens (default: the embedded emulator's cache, or what an engine URL states;
    # without either, the shares count slots only).
    zero_bid_share: float = Field(default=0.5, gt=0, le=1)
    """The share of the engine's slots and tokens that zero-bid requests may hold together."""
    user_share: float = Field(default=0.5, gt=0, le=1)
    """The share of the engine one user may hold while another user's requests wait."""
    engine_tokens: int | None = Field(default=None, ge=1)
    """The engine's KV capacity in tokens, for the shares (default: the emulator's cache, or
    what an engine URL states as its `max_total_num_tokens`; without either, slots only)."""

    # Dispatch ahead of the commit (server.serving.dispatch_ahead): a batch of at most
    # `dispatch_ahead_max_batch` requests, all of whose users could afford their queued bids
    # when the ledger last committed, goes to the engine while its settlement commits; no byte
    # of an answer leaves before that commit, and a batch it cannot settle whole is cancelled
    # at the engine and cleared again. Off: every batch waits for its commit first.
    dispatch_ahead: bool = True
    """Send a batch to the engine while its settlement commits, when its users could afford their
    bids at the last commit; answers still wait for the commit."""
    dispatch_ahead_max_batch: int = Field(default=64, ge=1)
    """The largest batch sent ahead of its commit."""

    # The serving path's group commits run on threads of the server (server.ledger_writer.writer).
    # `process` (a writer process of their own) was removed: it is refused by name.
    ledger_writer: Literal["thread"] = "thread"
    """Where the ledger's group commits run: `thread`, the only choice (`process` was removed)."""

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
    """The highest bid accepted, in credits."""
    max_prompt_tokens: int = Field(default=131_072, ge=1)
    """The longest prompt accepted, in tokens."""
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    """The longest prompt accepted, in characters."""
    max_new_tokens_limit: int = Field(default=32_768, ge=1)
    """The highest `max_new_tokens` accepted."""
    # Hostile bodies: refused by name before any recursive walk or costly validation.
    max_json_depth: int = Field(default=32, ge=2, le=500)
    """The deepest nesting of a JSON body accepted."""
    max_logit_bias_entries: int = Field(default=4_096, ge=0)
    """The most `logit_bias` entries accepted."""
    max_custom_params_bytes: int = Field(default=65_536, ge=0)
    """The largest `custom_params` accepted, in bytes of JSON."""

    # Connections: a request whose headers and body have not all arrived this long after its
    # first byte (or after the connection opened) is cut off; above `max_connections` open
    # connections, a new one is answered 503 and closed at once.
    http_read_timeout_seconds: float = Field(default=30.0, gt=0)
    """A connection must send a whole request (headers and body) within this time, or it is
    closed."""
    # A connection whose client takes none of its waiting answer for this long is dropped
    # (a stream nobody reads); its request counts as left by its client.
    http_write_timeout_seconds: float = Field(default=30.0, gt=0)
    """A stream whose client reads nothing of its waiting answer for this long is dropped."""
    # One client address may hold at most this share of `max_connections`, and one client
    # (the address a trusted proxy forwards) or one API key at most this share in requests
    # being served at once; a trusted proxy's own addresses (SMG, a load balancer) are exempt.
    connection_share_per_client: float = Field(default=0.25, gt=0, le=1)
    """The share of `max_connections` one client address, forwarded client or API key may
    hold."""
    trusted_proxies: list[str] = Field(default_factory=list)
    """Addresses or networks (`10.0.0.0/24`) of proxies (SMG, a load balancer) whose
    forwarding header (`trusted_proxy_header`) names the client; exempt from the per-address
    share."""
    # Only the header the proxies write is read: the other one, passed on untouched, says
    # whatever the client put in it.
    trusted_proxy_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    """The header the trusted proxies write the client's address in: `x-forwarded-for`, or
    `forwarded` (RFC 7239 `Forwarded: for=`); the other is ignored."""
    max_connections: int = Field(default=2_048, ge=1)
    """Above this many open connections, new ones are answered 503 and closed."""

    # Per-key rate limit (token bucket): sustained requests per second and burst, for the
    # whole deployment; each of `rate_limit_replicas` replicas enforces its equal share.
    rate_limit_per_second: float = Field(default=200.0, gt=0)
    """Sustained requests per second per API key, for the whole deployment."""
    rate_limit_burst: int = Field(default=400, ge=1)
    """Burst of requests per API key above the sustained rate."""
    rate_limit_replicas: int = Field(default=1, ge=1, le=1024)
    """Replicas sharing the rate limit; each enforces its equal share."""

    # The pricing rule (docs/SPEC.md, "Fixed priority slots and the request fee"): every batch
    # is priced against `priority_slots` slots (by default `batch_size`; one value for every
    # replica of a deployment, recorded with each batch), so requests that delay nobody lower
    # no charge. `batch-size` is the paper's rule (slots = the batch's own size), kept for
    # comparison; it lets zero-bid junk requests dilute every charge. `request_fee_micros` is
    # the rule's fee, paid by every request, zero bids included, on top of its VCG charge: what
    # makes a decoy cost its sender. Its default is 0 because the right fee is a share of the
    # deployment's bids (docs/SPEC.md recommends two slots of the mean bid), which the server
    # cannot know before it has traffic, and because any fee takes away the free zero-bid
    # requests a budget of 0 can send today. Replicas sharing a ledger must agree on all three
    # (`billing.replica_rules`).
    pricing_rule: Literal["fixed-slots", "batch-size"] = "fixed-slots"
    """How a batch is priced: `fixed-slots` (every batch in `priority_slots` slots) or the
    paper's `batch-size` (each batch in its own size; open to price dilution)."""
    priority_slots: int | None = Field(default=None, ge=1, le=100_000)
    """The slots K every batch is priced in under `fixed-slots` (default: `batch_size`; at
    least `batch_size`; the same on every replica)."""
    request_fee_micros: int = Field(default=0, ge=0, le=1_000_000_000_000)
    """The fee every request pays besides its VCG charge, zero bids included, in micro-credits;
    held with the bid, given back when the request fails (default 0: no fee; the same on
    every replica)."""

    # The pricing mode (docs/guides/pricing-modes.md): `auction` (bids, VCG charges, the rule
    # above), `tiers` (fixed prices per request, `tiers`, a dearer tier served first, first
    # come first served within one) or `fcfs` (first come, first served; bids ignored, nobody
    # charged). Every replica on one ledger runs the same mode and tiers.
    pricing: Literal["auction", "tiers", "fcfs"] = "auction"
    """How priority is sold: `auction` (bids and VCG charges), `tiers` (fixed prices per request,
    `tiers`) or `fcfs` (first come, first served: bids ignored, nothing charged); the same on
    every replica."""
    tiers: str = "flex=0,default=0.0005,priority=0.005"
    """The tiers sold under `pricing tiers`: `name=price` pairs, price in credits per request,
    each price different (a dearer tier is served first)."""
    default_tier: str | None = None
    """The tier of a request that names none (or `auto`) under `pricing tiers`; by default the
    cheapest."""

    # This replica's name on its health, responses and (only when set) metrics; by default
    # host:port.
    replica_name: str | None = Field(default=None, min_length=1, max_length=128)
    """This replica's name on its health, responses and metrics; by default host:port."""
    # Each server process writes a heartbeat row (its pricing rule, `billing.replica_rules`)
    # this often: the row stays live (30 s) and `/health` sees a ledger that cannot write
    # within one beat, requests or none.
    ledger_heartbeat_seconds: float = Field(default=5.0, gt=0, le=10)
    """How often this server writes its heartbeat to the ledger (and so checks the ledger can
    write, for `/health`)."""

    # The ledger's periodic jobs (period rollover, stale holds, reconciliation); with the
    # election, only the replica holding a PostgreSQL advisory lock runs them.
    run_jobs: bool = True
    """Run the ledger's periodic jobs (period rollover, stale holds, reconciliation) in this
    server."""
    jobs_leader_election: bool = False
    """Run those jobs only on the replica that holds a PostgreSQL advisory lock."""

    log_format: Literal["text", "json"] = "text"
    """The server's log lines: `text`, or `json` (one object a line, with the `request_id`,
    `user` and `batch` of the request a line belongs to)."""

    @model_validator(mode="after")
    def _slots_hold_a_batch(self) -> ServerSettings:
        if self.priority_slots is not None and self.priority_slots < self.batch_size:
            raise ValueError(
                f"priority_slots ({self.priority_slots}) must be at least batch_size"
                f" ({self.batch_size}): a batch never holds more requests than its slots"
            )
        return self

    @model_validator(mode="after")
    def _rolling_prices_fixed_slots(self) -> ServerSettings:
        if self.pricing_rule == "batch-size" and "scheduling" not in self.model_fields_set:
            # The paper's rule prices whole batches: it keeps the batches it was made for.
            self.scheduling = "batches"
        rolling_auction = self.scheduling == "rolling" and self.pricing == "auction"
        if rolling_auction and self.pricing_rule == "batch-size":
            raise ValueError(
                "pricing_rule batch-size prices a batch in its own size, which a rolling "
                "auction's head does not have: use pricing_rule fixed-slots, or scheduling "
                "batches"
            )
        return self

    @property
    def posts_price_floor(self) -> bool:
        """Whether this server posts a price floor: `price_floor posted` under the rolling
        auction (the other modes have no auction pool to admit to)."""
        return (
            self.price_floor == "posted"
            and self.pricing == "auction"
            and self.scheduling == "rolling"
        )

    @model_validator(mode="after")
    def _floor_needs_rolling_auction(self) -> ServerSettings:
        # The default floor applies where it can; one asked for by name must have its auction.
        if (
            self.price_floor == "posted"
            and "price_floor" in self.model_fields_set
            and not self.posts_price_floor
        ):
            raise ValueError(
                "--price-floor posted needs --pricing auction and --scheduling rolling (this "
                f"server runs --pricing {self.pricing} --scheduling {self.scheduling})"
            )
        return self

    @model_validator(mode="after")
    def _tiers_parse(self) -> ServerSettings:
        self.tier_menu()  # a ValueError names what is wrong
        if self.pricing != "auction" and self.request_fee_micros:
            pays = {
                "tiers": "the price of its tier",
                "fcfs": "nothing (requests are served in the order they arrive)",
            }[self.pricing]
            raise ValueError(
                f"request_fee_micros ({self.request_fee_micros}) is the auction's fee: under "
                f"pricing {self.pricing} a request pays {pays}; set it to 0"
            )
        return self

    def tier_menu(self) -> TierMenu:
        """The tiers of `pricing tiers`, dearest first."""
        maximum = self.max_bid_credits * 1_000_000
        return parse_tiers(self.tiers, self.default_tier, maximum=maximum)

    def auction_rule(self) -> PricingRule:
        """The rule every batch of this server is cleared under."""
        from inference_auctions.server.auction.charges import PricingRule  # noqa: PLC0415

        if self.pricing != "auction":
            return PricingRule(mode=self.pricing)
        fee = self.request_fee_micros
        if self.pricing_rule == "batch-size":
            return PricingRule(request_fee_micros=fee)
        return PricingRule(
            slots=self.priority_slots or self.batch_size,
            request_fee_micros=fee,
            rolling=self.scheduling == "rolling",
        )

    def tiers_signature(self) -> str | None:
        """Under `pricing tiers`, the tiers sold and the default one, which every replica on
        one ledger must agree on (`billing.replica_rules`); None otherwise."""
        if self.pricing != "tiers":
            return None
        menu = self.tier_menu()
        sold = ",".join(f"{tier.name}={tier.price_micros}" for tier in menu.tiers)
        return f"{sold};default={menu.default.name}"


def without_password(url: str) -> str:
    """The database URL with its password masked, for logs and the console."""
    return mask_database_url(url)
