"""Two versions of the auction server against each other, alternated on the same processes.

`bench.serving` measures one version, and on a shared machine the same code measures tens of
percent apart from one minute to the next. A change worth a tenth of the server's CPU only
shows against the code before it, measured in the same minutes. This runs both:

* the baseline: the server at a git ref (`--baseline`, default HEAD), checked out into a
  temporary worktree and run from there (its directory and `PYTHONPATH`, ahead of this
  checkout's editable install; checked at start);
* the candidate: this checkout as it is on disk, uncommitted changes included (or another
  ref, `--candidate`).

Both sit in front of one SGLang emulator (`emulate-sglang --time-scale 0.001`), each over a
ledger of its own that its own code migrated, with 8 users each. For every round and
connection count, each version gets a fresh server, a `wrk` warm-up and a measured `wrk` run
(bench/wrk/auction_generate.lua, as in `bench.serving`); the order of the two alternates from
one round to the next, so a drift of the machine's speed falls on both alike.
`--baseline-arg`/`--candidate-arg` pass options to one side's `inference-auction serve`, to
compare settings of the same code; `--baseline-python`/`--candidate-python` run one side's
server (and its ledger's setup) with another Python interpreter, one that has the project's
dependencies installed, to compare interpreters (the emulator and `wrk` stay the same).

Per connection count it prints each version's median and range of req/s, the server's CPU
per request (user + system of its process tree, from /proc, during the measured run) and the
part of it its main thread spent (the event loop; the rest is the ledger writer's threads and
any helpers), the emulator's CPU per request, the p50 latency and the mean batch size (the
server's metrics), then the candidate against the baseline round by round: the median of the
per-round ratios and in how many rounds the candidate was ahead, and the same for the server's
CPU per request divided by the emulator's in the same run (the emulator, the same code for
both, measures the machine's speed at that moment). Ratios near 1.00 with the wins split are
noise.

Run: `python -m bench.serving_ab --baseline HEAD --connections 1 20 200 --rounds 4`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress

from bench.serving_ledger import BUDGET_MICROS, add_postgres_option, empty_database
from bench.serving_processes import (
    Service,
    free_port,
    main_thread_cpu_seconds,
    settle,
    start_service,
)
from bench.serving_wrk import add_load_options, run_wrk

ROOT = Path(__file__).resolve().parent.parent
USERS = 8
_CLI = ["-m", "inference_auctions.server.cli"]

# Run by each version's own code (PYTHONPATH), so each ledger has that version's schema: the
# calls are ones every version of the ledger has had.
_SETUP = """
import sys
from inference_auctions.billing import Ledger, migrate
url, count, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
migrate.upgrade(url)
with Ledger.from_url(url) as ledger:
    print(" ".join(
        ledger.create_user(f"bench{u}", budget_micros=budget).api_key for u in range(count)
    ))
"""
_WHERE = "import inference_auctions.server as s, os; print(os.path.realpath(s.__file__))"


@dataclass
class Version:
    """One side of the comparison: where its code is and what its server is told."""

    side: str  # "baseline" or "candidate"
    label: str
    root: Path  # the checkout whose `inference_auctions` the server imports
    server_args: list[str]
    python: str = sys.executable  # the interpreter that runs its server and its setup
    url: str = ""
    keys: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment that makes Python import this version's package."""
        if self.root == ROOT:
            return {}
        inherited = os.environ.get("PYTHONPATH", "")
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(self.root), inherited]))}


@dataclass(frozen=True)
class Run:
    """One measured `wrk` run of one version at one connection count."""

    rate: float
    cpu_ms: float
    loop_cpu_ms: float  # the server's main thread (its event loop); the rest is other threads
    emulator_cpu_ms: float
    p50_ms: float
    batch_size: float | None
    not_ok: int


def _python(version: Version, *args: str) -> str:
    done = subprocess.run(
        [version.python, *args],
        env={**os.environ, **version.env},
        cwd=version.root,  # `inference_auctions` is a namespace package: the first on the path wins
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{version.label}: {' '.join(args[:2])} failed:\n{done.stderr}")
    return done.stdout.strip()


def check_imports(version: Version) -> None:
    """Fail unless Python, with this version's environment, imports its own package."""
    found = Path(_python(version, "-c", _WHERE))
    if not found.is_relative_to(version.root.resolve()):
        raise RuntimeError(
            f"{version.label}: Python imports inference_auctions.server from {found}, not from "
            f"{version.root}; is the package installed somewhere that wins over PYTHONPATH?"
        )


@contextmanager
def worktree(ref: str, folder: Path) -> Iterator[Path]:
    """A detached checkout of `ref` in `folder`, removed afterwards."""
    path = folder / f"worktree-{len(list(folder.glob('worktree-*')))}"
    added = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if added.returncode != 0:
        raise RuntimeError(f"cannot check out {ref!r}: {added.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
        )


def _batch_size(metrics: str) -> float | None:
    """The mean batch size since the server started, from its Prometheus text."""
    values = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name in ("inference_auction_batch_size_sum", "inference_auction_batch_size_count"):
            values[name.rsplit("_", 1)[1]] = float(value)
    count = values.get("count")
    return values["sum"] / count if count else None


class Comparison:
    """The emulator, both versions' ledgers, and the runs."""

    def __init__(self, args: argparse.Namespace, stack: ExitStack, folder: Path) -> None:
        self.args = args
        self.stack = stack
        self.folder = folder
        port = free_port()
        command = [sys.executable, *_CLI, "emulate-sglang", "--port", str(port)]
        command += ["--log-level", "warning", "--time-scale", args.time_scale]
        self.emulator = self._start("emulator", command, f"http://127.0.0.1:{port}", {})

    def _start(self, name: str, command: list[str], url: str, env: dict[str, str]) -> Service:
        service = start_service(
            name, command, url=url, health_path="/health", log_dir=self.folder, env=env
        )
        self.stack.callback(service.stop)
        return service

    def prepare(self, version: Version) -> None:
        """The version's ledger, migrated and with its users, by its own code."""
        check_imports(version)
        version.url = self.stack.enter_context(
            empty_database(self.args.database, self.folder, self.args.postgres_url, version.side)
        )
        version.keys = _python(
            version, "-c", _SETUP, version.url, str(USERS), str(BUDGET_MICROS)
        ).split()

    def measure(self, version: Version, connections: int) -> Run:
        """A fresh server of `version`, warmed up, then one measured run."""
        port = free_port()
        command = [version.python, *_CLI, "serve", "--port", str(port)]
        command += ["--engine-url", self.emulator.url, "--database-url", version.url]
        command += ["--log-level", "warning", "--tokenizer", "builtin", *version.server_args]
        env = {
            **version.env,
            "INFERENCE_AUCTION_RATE_LIMIT_PER_SECOND": "1000000",
            "INFERENCE_AUCTION_RATE_LIMIT_BURST": "1000000",
        }
        server = start_service(
            f"auction-{version.side}",
            command,
            url=f"http://127.0.0.1:{port}",
            health_path="/health",
            log_dir=self.folder,
            env=env,
            cwd=version.root,
        )
        try:
            script, keys = "auction_generate.lua", version.keys
            run_wrk(script, server.url, connections, self.args.warmup, keys)
            settle([self.emulator, server])
            pid = server.process.pid
            before = server.cpu_seconds(), main_thread_cpu_seconds(pid)
            emulator_before = self.emulator.cpu_seconds()
            result = run_wrk(script, server.url, connections, self.args.seconds, keys)
            spent = server.cpu_seconds() - before[0], main_thread_cpu_seconds(pid) - before[1]
            emulator_spent = self.emulator.cpu_seconds() - emulator_before
            metrics = httpx.get(server.url + "/metrics", timeout=30).text
        finally:
            server.stop()
        requests = max(result.requests, 1)
        return Run(
            rate=result.rate,
            cpu_ms=1000 * spent[0] / requests,
            loop_cpu_ms=1000 * spent[1] / requests,
            emulator_cpu_ms=1000 * emulator_spent / requests,
            p50_ms=result.p50_ms,
            batch_size=_batch_size(metrics),
            not_ok=result.not_ok,
        )


def _spread(values: Sequence[float], digits: int) -> str:
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:,.{digits}f}"
    return f"{middle:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _paired(candidate: list[float], baseline: list[float], higher_is_better: bool) -> str:
    ratios = [c / b for c, b in zip(candidate, baseline, strict=True) if b]
    if not ratios:
        return "-"
    wins = sum(1 for r in ratios if (r > 1) == higher_is_better and r != 1)
    return f"{statistics.median(ratios):.2f}x, ahead in {wins} of {len(ratios)}"


def _per_emulator(runs: list[Run]) -> list[float]:
    return [run.cpu_ms / run.emulator_cpu_ms if run.emulator_cpu_ms else 0.0 for run in runs]


HEADERS = [
    "version",
    "req/s",
    "server CPU ms/req",
    "of it, the loop's",
    "emulator CPU ms/req",
    "p50 ms",
    "batch size",
    "non-2xx",
]


def table(connections: int, versions: list[Version], runs: dict[str, list[Run]]) -> str:
    """One connection count as markdown: each version's median (range), then the candidate
    against the baseline round by round."""
    rounds = len(runs[versions[0].label])
    lines = [f"{connections} connections, {rounds} rounds:", ""]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|")
    for version in versions:
        mine = runs[version.label]
        sizes = [run.batch_size for run in mine if run.batch_size is not None]
        cells = [
            version.label,
            _spread([run.rate for run in mine], 0),
            _spread([run.cpu_ms for run in mine], 3),
            _spread([run.loop_cpu_ms for run in mine], 3),
            _spread([run.emulator_cpu_ms for run in mine], 3),
            _spread([run.p50_ms for run in mine], 2),
            _spread(sizes, 1) if sizes else "-",
            str(sum(run.not_ok for run in mine)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    base, cand = runs[versions[0].label], runs[versions[1].label]
    lines += [
        "",
        "candidate / baseline, the median of the per-round ratios: "
        f"req/s {_paired([r.rate for r in cand], [r.rate for r in base], True)}; "
        f"server CPU {_paired([r.cpu_ms for r in cand], [r.cpu_ms for r in base], False)}; "
        f"p50 {_paired([r.p50_ms for r in cand], [r.p50_ms for r in base], False)}.",
        # The emulator runs the same code for both and does the same work per request, so its
        # CPU per request tracks the machine's speed in that run: the server's CPU in those
        # units takes out most of a shared machine's drift between one run and the next.
        "server CPU per emulator CPU, candidate / baseline: "
        f"{_paired(_per_emulator(cand), _per_emulator(base), False)}.",
        "",
    ]
    return "\n".join(lines)


def _version(args: argparse.Namespace, side: str, code: str, root: Path) -> Version:
    """One side as the command line sets it, labelled with what differs from the defaults."""
    server_args: list[str] = getattr(args, f"{side}_arg")
    python: str | None = getattr(args, f"{side}_python")
    label = f"{side}: {code}" + (f" {' '.join(server_args)}" if server_args else "")
    label += f" ({python})" if python else ""
    return Version(side, label, root, server_args, python or sys.executable)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--baseline", default="HEAD", help="git ref of the baseline (default: HEAD)"
    )
    parser.add_argument(
        "--candidate",
        help="git ref of the candidate (default: this checkout as it is, uncommitted changes "
        "included)",
    )
    for side in ("baseline", "candidate"):
        parser.add_argument(
            f"--{side}-python",
            metavar="PYTHON",
            help=f"the Python interpreter of the {side}'s server, a path or a name on PATH "
            f"(default: this one, {sys.executable}); it needs the project's dependencies",
        )
        parser.add_argument(
            f"--{side}-arg",
            action="append",
            default=[],
            metavar="ARG",
            help=f"an extra argument for the {side}'s `inference-auction serve` (repeat: "
            f"--{side}-arg=--saturation-requests --{side}-arg=4)",
        )
    add_load_options(parser, seconds=8)
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each version per count (default: 3)"
    )
    parser.add_argument(
        "--database",
        choices=["sqlite", "postgresql"],
        default="sqlite",
        help="the servers' ledgers (default: sqlite)",
    )
    add_postgres_option(parser)
    parser.add_argument(
        "--time-scale", default="0.001", help="the emulator's --time-scale (default: 0.001)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if any(count < 1 for count in args.connections):
        parser.error("--connections must all be at least 1")
    for side in ("baseline", "candidate"):
        python = getattr(args, f"{side}_python")
        if python is None:
            continue
        found = shutil.which(python)  # a path, or a name on PATH such as python3.12
        if found is None:
            parser.error(f"--{side}-python {python!r} is not an executable file")
        setattr(args, f"{side}_python", found)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Compare the two versions and print one table per connection count."""
    args = _parse(argv)
    started = time.monotonic()
    console = Console()
    try:
        _compare(args, console)
    except RuntimeError as error:  # a ref that is not there, a version that would not start
        raise SystemExit(f"bench.serving_ab: {error}") from None
    console.print(f"({time.monotonic() - started:.0f} s in all)")


def _compare(args: argparse.Namespace, console: Console) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-serving-ab-") as scratch,
        ExitStack() as stack,
    ):
        folder = Path(scratch)
        baseline_root = stack.enter_context(worktree(args.baseline, folder))
        candidate_root = (
            ROOT
            if args.candidate is None
            else stack.enter_context(worktree(args.candidate, folder))
        )
        versions = [
            _version(args, "baseline", args.baseline, baseline_root),
            _version(args, "candidate", args.candidate or "this checkout", candidate_root),
        ]
        comparison = Comparison(args, stack, folder)
        for version in versions:
            comparison.prepare(version)
        steps = len(args.connections) * args.rounds * len(versions)
        with Progress(transient=True, console=console) as progress:
            task = progress.add_task("measuring", total=steps)
            for connections in args.connections:
                runs: dict[str, list[Run]] = {version.label: [] for version in versions}
                for round_number in range(args.rounds):
                    order = versions if round_number % 2 == 0 else versions[::-1]
                    for version in order:
                        progress.update(
                            task,
                            description=f"{connections} connections, round {round_number + 1}, "
                            f"{version.label}",
                        )
                        runs[version.label].append(comparison.measure(version, connections))
                        progress.advance(task)
                progress.console.print(
                    table(connections, versions, runs),
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )


if __name__ == "__main__":
    main()
