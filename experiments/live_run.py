"""One run of the live market experiment: a real server in a process of its own, one SDK client
per tenant sending the plan's requests at their times, and what each request got.

The server is `inference-auction serve` with the embedded emulator at real time (the H100 cost
model's seconds are wall-clock seconds) and a small running-request limit, so that the engine,
not this machine's CPU, is the bottleneck; the clients run in this process. With `engine_url`
the server is in front of a real SGLang server instead, its prefix cache flushed before each
run. Each scheme is a pricing mode of the same server:

* `fcfs`: `--pricing fcfs`; clients send no bid (a bid would be ignored);
* `tiersN`: `--pricing tiers` with the plan's N prices; each request's tier is the SDK's
  `choose_tier` of its value on the server's published figures and the client's budget left;
* `auction`: the default (its posted price floor included, SPEC section 7, "The price floor");
  each client's pacing autobidder bids for its values under its budget;
* `auction-no-floor`: the same under `--price-floor off`; not among the schemes run unless
  asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import httpx

from inference_auctions.billing import Ledger
from inference_auctions.experiments.live_plan import LivePlan, PlannedRequest, tier_prices
from inference_auctions.sdk import (
    APIError,
    AsyncAuctionClient,
    BelowFloorWarning,
    Budget,
    TierMenu,
    choose_tier,
)

__all__ = [
    "DEFAULT_SCHEMES",
    "SCHEMES",
    "RequestRecord",
    "RunResult",
    "ServerSetup",
    "plan_digest",
    "run_scheme",
]

SCHEMES = ("fcfs", "tiers2", "tiers3", "auction", "auction-no-floor")
# What a live run runs unless told otherwise (docs/RESULTS.md's table).
DEFAULT_SCHEMES = ("fcfs", "tiers2", "tiers3", "auction")
_TIER_NAMES = {2: ("flex", "priority"), 3: ("flex", "default", "priority")}
_MENU_SECONDS = 2.0  # how long a client reuses the published tiers


@dataclass(frozen=True, slots=True)
class ServerSetup:
    """The settings every run shares (`docs/RESULTS.md` states them): the server's defaults but
    for the emulator's running-request limit, which makes the engine the bottleneck."""

    max_running_requests: int = 8
    cache_tokens: int = 23_000
    batch_size: int = 64
    max_inflight: int = 256
    time_scale: float = 1.0
    # The auction's request fee: 0, the default, in every run (the fixed-price modes take none).
    request_fee_micros: int = 0
    # A real SGLang server (started with its own running-request limit) instead of the
    # embedded emulator; its capacity is then measured, not computed (`engine_capacity_at`).
    engine_url: str | None = None

    def env(self) -> dict[str, str]:
        """The server's settings as `INFERENCE_AUCTION_*` variables."""
        engine = (
            {
                "EMULATOR_MAX_RUNNING_REQUESTS": str(self.max_running_requests),
                "EMULATOR_CACHE_TOKENS": str(self.cache_tokens),
                "EMULATOR_TIME_SCALE": str(self.time_scale),
            }
            if self.engine_url is None
            else {"ENGINE_URL": self.engine_url}
        )
        return {
            **engine,
            "BATCH_SIZE": str(self.batch_size),
            "MAX_INFLIGHT": str(self.max_inflight),
            "RUN_JOBS": "false",
            "RATE_LIMIT_PER_SECOND": "10000",
            "RATE_LIMIT_BURST": "10000",
            "REQUEST_FEE_MICROS": str(self.request_fee_micros),
        }


@dataclass(slots=True)
class RequestRecord:
    """What one planned request got."""

    index: int
    tenant: str
    value_micros: int
    sent: float  # seconds from the run's start
    ttft: float | None = None  # seconds from sending to its first token, as the client saw it
    charge_micros: int = 0
    bid_micros: int = 0  # what the server admitted it at: its bid, its tier's price, or 0
    tier: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


@dataclass(slots=True)
class RunResult:
    """A scheme's run: every request's record, the ledger's spend per tenant, the CPU used."""

    scheme: str
    records: list[RequestRecord]
    spend: dict[str, int]  # tenant -> charges net of refunds, from the ledger
    tier_prices: dict[str, int] = field(default_factory=dict)
    client_cpu_seconds: float = 0.0
    server_cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    plan_digest: str = ""


def plan_digest(requests: list[tuple[int, str, float, int]]) -> str:
    """A digest of the arrivals and values a run sent: (index, tenant, at, value)."""
    return hashlib.sha256(json.dumps(sorted(requests)).encode()).hexdigest()[:16]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scheme_env(scheme: str, plan: LivePlan) -> tuple[dict[str, str], dict[str, int]]:
    if scheme == "auction":
        return {"PRICING": "auction"}, {}
    if scheme == "auction-no-floor":
        return {"PRICING": "auction", "PRICE_FLOOR": "off"}, {}
    if scheme == "fcfs":
        return {"PRICING": "fcfs"}, {}
    count = int(scheme.removeprefix("tiers"))
    prices = tier_prices([r.value_micros for r in plan.requests], count)
    menu = dict(zip(_TIER_NAMES[count], prices, strict=True))
    tiers = ",".join(f"{name}={Decimal(price) / 1_000_000}" for name, price in menu.items())
    return {"PRICING": "tiers", "TIERS": tiers}, menu


@contextlib.contextmanager
def _server(env: dict[str, str], workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    variables = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    variables.update({f"INFERENCE_AUCTION_{k}": v for k, v in env.items()})
    variables["INFERENCE_AUCTION_PORT"] = str(port)
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        [*command, "--log-level", "warning"], env=variables, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server did not start: {(workdir / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def _cpu_seconds(pid: int) -> float:
    """A live process's user and system CPU seconds (Linux `/proc`; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Tenant:
    """One tenant's SDK client and how it prices its requests under the scheme."""

    def __init__(self, scheme: str, client: AsyncAuctionClient) -> None:
        self.scheme = scheme
        self.client = client
        self._menu: tuple[float, TierMenu] | None = None
        # Tier prices of requests sent and not answered: the client's budget does not know
        # them (a tier request bids 0), so its tier choices leave room for them.
        self._in_flight_micros = 0

    async def send(self, request: PlannedRequest, record: RequestRecord, started: float) -> None:
        value: Decimal | int = Decimal(request.value_micros) / 1_000_000
        extra: dict[str, str] = {}
        if self.scheme == "fcfs":
            value = 0  # bids would be ignored: the client sends none
        reserved = 0
        if self.scheme.startswith("tiers"):
            available = max(0, self.client.bidder.available_micros - self._in_flight_micros)
            tier = choose_tier(value, await self._tiers(), available_micros=available)
            record.tier, extra, value = tier.name, {"service_tier": tier.name}, 0
            reserved = tier.price_micros
            self._in_flight_micros += reserved
        try:
            await self._send(request, record, started, value, extra)
        finally:
            self._in_flight_micros -= reserved

    async def _send(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        started: float,
        value: Decimal | int,
        extra: dict[str, str],
    ) -> None:
        sent = time.monotonic()
        record.sent = sent - started
        try:
            reply = await self.client.generate(
                request.prompt,
                value=value,
                max_new_tokens=request.max_new_tokens,
                # Every answer as long as planned, whatever the model would stop at.
                sampling_params={"ignore_eos": True},
                extra_body=extra,
                max_retries=0,
            )
        except APIError as error:
            record.error = type(error).__name__
            return
        elapsed = time.monotonic() - sent
        # The engine's decoding time after its first token is not the client's wait for it.
        decoding = 0.0
        if reply.e2e_latency is not None and reply.first_token_latency is not None:
            decoding = max(0.0, reply.e2e_latency - reply.first_token_latency)
        record.ttft = max(0.0, elapsed - decoding)
        record.charge_micros = reply.auction.request_charge_micros
        record.bid_micros = reply.auction.bid_micros
        record.prompt_tokens = reply.usage.prompt_tokens
        record.cached_tokens = reply.usage.cached_tokens

    async def _tiers(self) -> TierMenu:
        now = time.monotonic()
        if self._menu is None or now - self._menu[0] > _MENU_SECONDS:
            self._menu = (now, await self.client.market.tiers())
        return self._menu[1]


async def _drive(
    scheme: str, plan: LivePlan, url: str, keys: dict[str, str], tick: Callable[[], None]
) -> list[RequestRecord]:
    tenants: dict[str, _Tenant] = {}
    for tenant, key in keys.items():
        count = max(1, len(plan.tenant_requests(tenant)))
        budget = Budget(total=Decimal(plan.budgets[tenant]) / 1_000_000, auctions=count)
        client = AsyncAuctionClient(
            url,
            key,
            budget=budget,
            on_budget_exhausted="bid_zero",
            timeout=600.0,
            sync_interval=None,
        )
        tenants[tenant] = _Tenant(scheme, client)
    records = [RequestRecord(r.index, r.tenant, r.value_micros, r.at) for r in plan.requests]
    started = time.monotonic()

    async def one(request: PlannedRequest, record: RequestRecord) -> None:
        await asyncio.sleep(max(0.0, started + request.at - time.monotonic()))
        try:
            await tenants[request.tenant].send(request, record, started)
        finally:
            tick()

    try:
        await asyncio.gather(*(one(r, rec) for r, rec in zip(plan.requests, records, strict=True)))
    finally:
        for sender in tenants.values():
            await sender.client.close()
    return records


def run_scheme(
    scheme: str,
    plan: LivePlan,
    setup: ServerSetup,
    tick: Callable[[], None] = lambda: None,
) -> RunResult:
    """Run the plan through a fresh server and ledger under `scheme`."""
    scheme_env, prices = _scheme_env(scheme, plan)
    if setup.engine_url is not None:  # every run starts from an empty prefix cache
        httpx.post(setup.engine_url + "/flush_cache", timeout=30)
    with tempfile.TemporaryDirectory(prefix=f"live-{scheme}-") as tmp:
        workdir = Path(tmp)
        database_url = f"sqlite:///{workdir / 'ledger.db'}"
        env = {**setup.env(), **scheme_env, "DATABASE_URL": database_url}
        with _server(env, workdir) as (url, process):
            ledger = Ledger.from_url(database_url)
            try:
                # A grant far above any budget: the clients' budgets bind, not the ledger's.
                keys = {
                    tenant: ledger.create_user(tenant, budget_micros=10**12).api_key
                    for tenant in plan.budgets
                }
                cpu_before = time.process_time()
                wall = time.monotonic()
                with warnings.catch_warnings():
                    # Under a posted floor the clients send their paced bids as they are, low
                    # ones too: waiting outside the auction is what the run measures.
                    warnings.simplefilter("ignore", BelowFloorWarning)
                    records = asyncio.run(_drive(scheme, plan, url, keys, tick))
                wall = time.monotonic() - wall
                client_cpu = time.process_time() - cpu_before
                server_cpu = _cpu_seconds(process.pid)
                # Charges net of refunds, over the run (the grant has no period).
                spend = {t: ledger.balance(t).spent_this_period_micros for t in plan.budgets}
                if not ledger.reconcile().ok:
                    raise RuntimeError(f"the ledger of the {scheme} run does not reconcile")
            finally:
                ledger.close()
    sent = [(r.index, r.tenant, plan.requests[r.index].at, r.value_micros) for r in records]
    return RunResult(
        scheme=scheme,
        records=records,
        spend=spend,
        tier_prices=prices,
        client_cpu_seconds=client_cpu,
        server_cpu_seconds=server_cpu,
        wall_seconds=wall,
        plan_digest=plan_digest(sent),
    )


def engine_capacity_at(url: str, requests: list[PlannedRequest]) -> float:
    """Requests per second a real SGLang server completes with all of `requests` at once."""

    async def burst() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            await client.post("/flush_cache")
            started = time.monotonic()
            sampling = {"ignore_eos": True}
            await asyncio.gather(
                *(
                    client.post(
                        "/generate",
                        json={
                            "text": r.prompt,
                            "sampling_params": {**sampling, "max_new_tokens": r.max_new_tokens},
                        },
                    )
                    for r in requests
                )
            )
            elapsed = time.monotonic() - started
            await client.post("/flush_cache")
            return len(requests) / elapsed

    return asyncio.run(burst())
