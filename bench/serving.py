"""The serving benchmark: `wrk` against the engine, the auction layer and a peer gateway, at once.

Three paths, driven by the same `wrk` settings (2 threads, the same connection counts and
duration, a short warm-up before each measured run), on this machine, in one run:

* direct: `wrk` -> the SGLang emulator (`emulate-sglang --time-scale 0.001`, its own process),
  or with `--engine sglang` the real SGLang 0.5.23 on this CPU (`make sglang-env` builds it;
  the tiny random-weight model, `--sglang-max-running` requests at once; the auction server
  then tokenizes with that model's own tokenizer.json, and LiteLLM is left out);
* auction: `wrk` -> the auction server (`inference-auction serve --engine-url <emulator>
  --tokenizer builtin`, its own process, a fresh one per connection count, over one ledger) ->
  the emulator; 8 users with large budgets, keys rotated and bids varied per request
  (bench/wrk/auction_generate.lua). The server tokenizes prompts in process with the builtin
  tokenizer, which is the emulator's own (checked against its `/tokenize` at start), as a
  production deployment would with `--tokenizer` pointing at its model's tokenizer.json;
  `--tokenizer engine` measures the round trip to the engine's `/tokenize` per prompt instead;
* direct streamed (`--direct-streamed`): `wrk` -> the emulator, each request streamed with the
  `stream_interval` the auction server asks for when its client waits for the whole answer
  (`engine_stream_interval`, 64: a chunk at the first token and one at the end). The server
  streams every request from the engine to see its first token, so this is what the engine
  spends on the requests the auction path sends it, against what it spends on the direct
  path's unstreamed ones;
* litellm: `wrk` -> LiteLLM's proxy (1 worker, no database, in `.bench-venvs/litellm`, created
  on first use) -> the emulator's OpenAI-compatible `/v1/chat/completions`.

Every request asks for 4 output tokens (`--output-tokens` sets another count). Per path and
connection count it reports requests, req/s, p50 and p99 latency and the non-2xx count (from
the Lua `done()`/`response()` hooks of bench/wrk), the CPU time per request of each process
involved (user + system from /proc, summed over the process tree, during the measured run only,
divided by the requests it completed), and for the auction server its own overhead (arrival to
dispatch minus the batching wait) and batching wait from `/v1/admin/timings` (over the warm-up
and the measured run of that server), and the throughput ratio to the direct path. A
1-connection run of direct and auction gives the latency the layer adds to a lone request.
Under the table, the server's CPU per request is also set against the emulator's CPU per
direct request of the same round: a second reading, for comparing runs taken in hours (or on
machines) of different speed. Afterwards the ledger is reconciled and audited: the
settled requests against the 2xx responses, open holds, and no user charged more than their
bids in a batch.

Run (wrk is the Debian package; the first run installs LiteLLM, which takes minutes):

    python -m bench.serving --connections 20 200 --seconds 10 --database both
    python -m bench.serving --database sqlite --skip-litellm --markdown results/serving.md

PostgreSQL: a database of its own is created on `--postgres-url` and dropped at the end.

`--repeat N` measures every connection count N times, the paths alternating, each time on a
fresh auction server: the machines this runs on are shared and their speed drifts by tens of
percent within minutes, so a single run can fall in a slow stretch. Every run is a row of the
table; the notes give, per connection count, the median and the range of what the targets
in docs/PERFORMANCE.md are about.

`--server-arg` passes an option to `inference-auction serve`; `--server-arg=--no-dispatch-ahead`
measures the path where every batch waits for its settlement's commit before the engine sees
it (docs/PERFORMANCE.md compares the two).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from bench import serving_litellm as litellm
from bench.serving_ledger import Audit, add_postgres_option, audit, create_users, fresh_database
from bench.serving_processes import Service, free_port, settle, start_service
from bench.serving_wrk import WrkResult, add_load_options, run_wrk
from bench.sglang_cpu.launcher import SGLangServer, sglang_home
from inference_auctions.server.emulator.live import DEFAULT_MODEL_NAME
from inference_auctions.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parent.parent
USERS = 8
_CLI = [sys.executable, "-m", "inference_auctions.server.cli"]


@dataclass
class Row:
    """One measured run of one path."""

    path: str
    connections: int
    result: WrkResult
    front_cpu_ms: float | None  # per request; None on the direct path (no front)
    emulator_cpu_ms: float | None  # None when no request completed
    timings: dict[str, Any] | None = None  # the auction server's /v1/admin/timings
    ratio: float | None = None  # req/s over the direct path's at the same connections


@dataclass
class Report:
    """One database's table, and its ledger's audit."""

    database: str
    rows: list[Row] = field(default_factory=list)
    audit: Audit | None = None
    auction_ok: int = 0  # 2xx responses of every auction run, warm-ups included
    # At most this many requests can be cut off in flight when those runs end (a warm-up and
    # a measured run per server, one request per connection each).
    auction_cut_bound: int = 0


@dataclass
class Settings:
    """The command line, parsed."""

    connections: list[int]
    seconds: float
    warmup: float
    single: bool
    databases: list[str]
    litellm: bool
    postgres_url: str
    time_scale: str
    markdown: Path | None
    server_args: list[str]
    tokenizer: str
    output_tokens: int
    repeat: int
    direct_streamed: bool = False
    engine: str = "emulator"  # or "sglang": the real SGLang on this CPU
    sglang_max_running: int = 32


class Bench:
    """The processes of one benchmark run and the runs themselves."""

    def __init__(self, settings: Settings, stack: ExitStack, folder: Path, progress: Progress):
        self.settings = settings
        self.stack = stack
        self.folder = folder
        self.progress = progress
        self.task = progress.add_task("starting", total=self._steps())
        self.emulator: Service | None = None
        self.litellm: Service | None = None
        self.litellm_key = litellm.master_key()

    def _steps(self) -> int:
        paths = 2 + self.settings.litellm + self.settings.direct_streamed
        per_database = paths * len(self.settings.connections) + (2 if self.settings.single else 0)
        return per_database * len(self.settings.databases) * self.settings.repeat

    def _service(
        self, name: str, command: Sequence[str], url: str, health: str, **env: str
    ) -> Service:
        service = start_service(
            name, command, url=url, health_path=health, log_dir=self.folder, env=env
        )
        self.stack.callback(service.stop)
        return service

    def start_shared(self) -> None:
        """The engine and, unless skipped, LiteLLM in front of it: both serve every table."""
        if self.settings.engine == "sglang":
            self._start_sglang()
            return
        port = free_port()
        command = [*_CLI, "emulate-sglang", "--port", str(port), "--log-level", "warning"]
        command += ["--time-scale", self.settings.time_scale]
        self.progress.update(self.task, description="starting the emulator")
        self.emulator = self._service("emulator", command, f"http://127.0.0.1:{port}", "/health")
        if not self.settings.litellm:
            return
        self.progress.update(self.task, description="LiteLLM's virtualenv (first run: minutes)")
        executable = litellm.ensure_venv(ROOT)
        config = litellm.write_config(
            self.folder, self.emulator.url, DEFAULT_MODEL_NAME, self.litellm_key
        )
        port = free_port()
        self.progress.update(self.task, description="starting LiteLLM's proxy")
        self.litellm = self._service(
            "litellm",
            litellm.command(executable, config, port),
            f"http://127.0.0.1:{port}",
            "/health/liveliness",
            **litellm.ENV,
        )
        # One request end to end, so a broken route fails here rather than as 100% non-2xx.
        reply = httpx.post(
            self.litellm.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {self.litellm_key}"},
            json={
                "model": litellm.MODEL_NAME,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "ping"}],
            },
            timeout=60,
        )
        if reply.status_code != 200:
            raise RuntimeError(f"LiteLLM -> emulator failed: {reply.status_code} {reply.text}")

    def _start_sglang(self) -> None:
        """The real SGLang as the engine, wrapped as a service so its CPU is read the same way."""
        self.progress.update(self.task, description="starting SGLang (about 30 s)")
        log = self.folder / "sglang.log"
        server = SGLangServer(max_running_requests=self.settings.sglang_max_running, log_path=log)
        server.start()
        self.stack.callback(server.stop)
        assert server.process is not None
        self.emulator = Service("sglang", server.process, server.url, log)

    def _measure(
        self,
        label: str,
        script: str,
        front: Service | None,
        connections: int,
        args: Sequence[str] = (),
    ) -> tuple[Row, WrkResult]:
        """Warm up, then one measured run with the CPU of each process read around it."""
        assert self.emulator is not None
        url = (front or self.emulator).url
        self.progress.update(self.task, description=f"{label}, {connections} connections")
        tokens = self.settings.output_tokens
        warm = run_wrk(script, url, connections, self.settings.warmup, args, tokens)
        processes = [self.emulator] + ([front] if front else [])
        settle(processes)  # what the warm-up left queued is served before the clock starts
        before = [p.cpu_seconds() for p in processes]
        result = run_wrk(script, url, connections, self.settings.seconds, args, tokens)
        spent = [p.cpu_seconds() - b for p, b in zip(processes, before, strict=True)]
        per_request = [1000 * s / result.requests if result.requests else None for s in spent]
        row = Row(
            label,
            connections,
            result,
            front_cpu_ms=per_request[1] if front else None,
            emulator_cpu_ms=per_request[0],
        )
        self.progress.advance(self.task)
        return row, warm

    def _auction(
        self, url: str, keys: list[str], admin: str, connections: int, report: Report
    ) -> Row:
        """A fresh auction server, so its timings and CPU are this connection count's alone."""
        assert self.emulator is not None
        port = free_port()
        command = [*_CLI, "serve", "--port", str(port), "--engine-url", self.emulator.url]
        command += ["--database-url", url, "--log-level", "warning"]
        command += ["--tokenizer", self.settings.tokenizer, *self.settings.server_args]
        server = self._service(
            "auction",
            command,
            f"http://127.0.0.1:{port}",
            "/health",
            INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND="1000000",
            INFERENCE_AUCTION_RATE_LIMIT_BURST="1000000",
        )
        try:
            row, warm = self._measure("auction", "auction_generate.lua", server, connections, keys)
            reply = httpx.get(
                server.url + "/v1/admin/timings",
                headers={"Authorization": f"Bearer {admin}"},
                timeout=30,
            )
            reply.raise_for_status()
            row.timings = reply.json()
        finally:
            server.stop()  # graceful: requests still in flight finish and settle
        report.auction_ok += row.result.ok + warm.ok
        report.auction_cut_bound += 2 * connections
        return row

    def database(self, kind: str) -> Report:
        """Every path at every connection count, over one fresh ledger of `kind`."""
        report = Report(kind)
        with fresh_database(kind, self.folder, self.settings.postgres_url) as url:
            users = create_users(url, USERS)
            levels = ([1] if self.settings.single else []) + self.settings.connections
            for connections in [level for level in levels for _ in range(self.settings.repeat)]:
                direct, _ = self._measure("direct", "emulator_generate.lua", None, connections)
                rows = [
                    direct,
                    self._auction(url, users.keys, users.admin_key, connections, report),
                ]
                if self.settings.direct_streamed and connections > 1:
                    interval = [str(ServerSettings().engine_stream_interval)]
                    rows.append(
                        self._measure(
                            "direct streamed", "emulator_generate.lua", None, connections, interval
                        )[0]
                    )
                if self.litellm is not None and connections > 1:
                    args = [self.litellm_key, litellm.MODEL_NAME]
                    rows.append(
                        self._measure(
                            "litellm", "litellm_chat.lua", self.litellm, connections, args
                        )[0]
                    )
                for row in rows[1:]:
                    row.ratio = row.result.rate / direct.result.rate if direct.result.rate else None
                report.rows += rows
            self.progress.update(self.task, description=f"auditing the {kind} ledger")
            report.audit = audit(url)
        return report


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


HEADERS = (
    "path",
    "conns",
    "requests",
    "req/s",
    "p50 ms",
    "p99 ms",
    "non-2xx",
    "front CPU ms/req",
    "emulator CPU ms/req",
    "overhead p50 / p99 ms",
    "batching wait p50 ms",
    "req/s vs direct",
)


def _cells(row: Row) -> list[str]:
    r = row.result
    overhead = wait = "-"
    if row.timings:
        o, w = row.timings["overhead"], row.timings["batching_wait"]
        overhead = f"{_ms(o['p50_ms'], 2)} / {_ms(o['p99_ms'], 2)}"
        wait = _ms(w["p50_ms"], 2)
    return [
        row.path,
        str(row.connections),
        f"{r.requests:,}",
        f"{r.rate:,.0f}",
        _ms(r.p50_ms if r.requests else None, 2),
        _ms(r.p99_ms if r.requests else None, 2),
        str(r.not_ok),
        _ms(row.front_cpu_ms, 2),
        _ms(row.emulator_cpu_ms, 2),
        overhead,
        wait,
        "-" if row.ratio is None else f"{row.ratio:.2f}x",
    ]


def _spread(values: Sequence[float], digits: int) -> str:
    """One value as it is; several as their median and range."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    low, middle, high = min(values), statistics.median(values), max(values)
    return f"{middle:,.{digits}f} ({low:,.{digits}f} to {high:,.{digits}f})"


def _runs(report: Report, connections: int, path: str) -> list[Row]:
    return [r for r in report.rows if r.connections == connections and r.path == path]


def _level_note(report: Report, connections: int) -> str | None:
    """What the targets are about at one connection count, over its runs (`--repeat`)."""
    runs = [r for r in _runs(report, connections, "auction") if r.result.requests]
    if len(runs) < 2:
        return None
    parts = [
        f"req/s {_spread([r.result.rate for r in runs], 0)}",
        f"throughput vs direct {_spread([r.ratio for r in runs if r.ratio is not None], 2)}",
        f"front CPU {_spread([r.front_cpu_ms for r in runs if r.front_cpu_ms is not None], 2)}"
        " ms/req",
    ]
    timed = [r.timings for r in runs if r.timings]
    if timed:
        p50 = _spread([t["overhead"]["p50_ms"] for t in timed], 2)
        p99 = _spread([t["overhead"]["p99_ms"] for t in timed], 2)
        parts.append(f"overhead p50 {p50} ms, p99 {p99} ms")
    return f"{connections} connections, auction over {len(runs)} runs: " + "; ".join(parts) + "."


def _cpu_against_engine(report: Report, connections: int) -> list[float]:
    """Per round: the server's CPU per request over the emulator's per direct request just
    before it, the emulator being a Python server on the same cores: a reading of the server's
    cost against the machine's speed that hour."""
    direct, auction = _runs(report, connections, "direct"), _runs(report, connections, "auction")
    pairs = zip(direct, auction, strict=False)  # an interrupted run may lack its last auction
    return [
        served.front_cpu_ms / engine.emulator_cpu_ms
        for engine, served in pairs
        if served.front_cpu_ms is not None and engine.emulator_cpu_ms
    ]


def _notes(report: Report) -> list[str]:
    notes = []
    # Each run's lone request against the direct run just before it.
    pairs = zip(_runs(report, 1, "direct"), _runs(report, 1, "auction"), strict=False)
    added = [auction.result.p50_ms - direct.result.p50_ms for direct, auction in pairs]
    if added:
        notes.append(
            f"1 connection: the auction layer adds {_spread(added, 2)} ms to the p50"
            + (f" ({len(added)} runs)." if len(added) > 1 else ".")
        )
    levels = sorted({r.connections for r in report.rows if r.connections > 1})
    for connections in levels:
        note = _level_note(report, connections)
        if note is not None:
            notes.append(note)
    against = [
        f"{connections} connections {_spread(ratios, 2)}x"
        for connections in levels
        if (ratios := _cpu_against_engine(report, connections))
    ]
    if against:
        notes.append(
            "Front CPU per request over the emulator's per direct request in the same round "
            "(against the machine's speed that hour): " + "; ".join(against) + "."
        )
    a = report.audit
    if a is not None:
        verdict = "clean" if a.clean else "NOT CLEAN"
        notes.append(
            f"Ledger {verdict}: reconciled={a.reconciled} (drifts {a.drifts}), "
            f"served {a.served:,} / failed {a.failed} / unresolved {a.scheduled}, "
            f"open holds {a.open_holds}, charged {a.charged_micros:,} micro-credits, "
            f"refunded {a.refunded_micros:,}, users charged above their bids {a.overcharged}."
        )
        gap = a.served - report.auction_ok
        verdict = "consistent" if 0 <= gap <= report.auction_cut_bound else "INCONSISTENT"
        notes.append(
            f"Settled as served {a.served:,} vs 2xx seen by wrk {report.auction_ok:,}: "
            f"{verdict} (difference {gap:+,}, at most {report.auction_cut_bound:,} requests "
            "can be in flight when wrk stops a run; the server still serves and charges them)."
        )
    return notes


def markdown(reports: list[Report], command: str) -> str:
    """Every table as markdown, with the command that produced it."""
    lines = [f"Command: `{command}`", ""]
    for report in reports:
        lines += [f"### {report.database}", ""]
        lines.append("| " + " | ".join(HEADERS) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|")
        lines += ["| " + " | ".join(_cells(row)) + " |" for row in report.rows]
        lines += ["", *(f"- {note}" for note in _notes(report)), ""]
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_load_options(parser, seconds=10)
    parser.add_argument(
        "--database",
        choices=["sqlite", "postgresql", "both"],
        default="sqlite",
        help="the auction server's ledger; one table each (default: sqlite)",
    )
    add_postgres_option(parser)
    parser.add_argument(
        "--skip-litellm", action="store_true", help="leave out the LiteLLM path (and its install)"
    )
    parser.add_argument(
        "--direct-streamed",
        action="store_true",
        help="also run wrk straight to the emulator with each request streamed as the auction "
        "server streams it from the engine (its engine_stream_interval, 64 by default), to show "
        "what the engine spends on those requests",
    )
    parser.add_argument(
        "--no-single", action="store_true", help="leave out the 1-connection direct/auction run"
    )
    parser.add_argument(
        "--time-scale", default="0.001", help="the emulator's --time-scale (default: 0.001)"
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for `inference-auction serve` (repeat: --server-arg=--max-wait-ms "
        "--server-arg=5)",
    )
    parser.add_argument(
        "--tokenizer",
        choices=["builtin", "engine"],
        default="builtin",
        help="who tokenizes prompts for the auction server: builtin (in process, the emulator's "
        "tokenizer) or engine (the emulator's /tokenize, a round trip per prompt) "
        "(default: builtin)",
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        default=4,
        help="max_new_tokens (max_tokens for LiteLLM) of every request on every path; the "
        "emulator produces exactly that many (default: 4)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure every connection count this many times, the paths alternating; the "
        "notes give the median and range (default: 1)",
    )
    parser.add_argument(
        "--engine",
        choices=["emulator", "sglang"],
        default="emulator",
        help="the engine behind every path: the emulator, or the real SGLang on this CPU "
        "(built by `make sglang-env`; implies --skip-litellm and the model's own tokenizer) "
        "(default: emulator)",
    )
    parser.add_argument(
        "--sglang-max-running",
        type=int,
        default=32,
        help="with --engine sglang: its --max-running-requests (default: 32)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    databases = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    real_engine = args.engine == "sglang"
    # The real engine's model has its own tokenizer: the server loads the very file SGLang
    # loads, as a production deployment would.
    tokenizer = str(sglang_home() / "model") if real_engine else args.tokenizer
    return Settings(
        connections=args.connections,
        seconds=args.seconds,
        warmup=args.warmup,
        single=not args.no_single,
        databases=databases,
        litellm=not (args.skip_litellm or real_engine),
        postgres_url=args.postgres_url,
        time_scale=args.time_scale,
        markdown=args.markdown,
        server_args=args.server_arg,
        tokenizer=tokenizer,
        output_tokens=args.output_tokens,
        repeat=args.repeat,
        direct_streamed=args.direct_streamed,
        engine=args.engine,
        sglang_max_running=args.sglang_max_running,
    )


def run(settings: Settings, show: Callable[[Report, Console], None]) -> list[Report]:
    """Start the processes, measure every database, stop everything (also on Ctrl-C)."""
    reports = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-serving-") as folder,
        ExitStack() as stack,
        Progress(transient=True) as progress,
    ):
        bench = Bench(settings, stack, Path(folder), progress)
        bench.start_shared()
        for kind in settings.databases:
            report = bench.database(kind)
            show(report, progress.console)
            reports.append(report)
    return reports


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print one table per database."""
    settings = _parse(argv)
    command = "python -m bench.serving " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()

    def show(report: Report, console: Console) -> None:
        table = markdown([report], command).split("\n", 2)[2]
        console.print(table, markup=False, highlight=False, soft_wrap=True)

    reports = run(settings, show)
    print(f"({time.monotonic() - started:.0f} s in all)")
    if settings.markdown is not None:
        settings.markdown.parent.mkdir(parents=True, exist_ok=True)
        settings.markdown.write_text(markdown(reports, command))


if __name__ == "__main__":
    main()
