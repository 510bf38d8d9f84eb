"""Start a deployment on one machine: emulated SGLang workers, one auction server per worker,
SMG in front; stop it all, router first, so no request is routed to a stopping replica.

Every part is its own process, as it would be on several hosts; the auction servers share one
database URL. The pieces are usable alone (a test can kill one replica and start it again),
and `run_cluster` starts and stops a whole deployment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from inference_auctions.billing import upgrade_schema
from inference_auctions.server.cluster.smg import RouterOptions, find_smg, smg_command

# The CLI run by this interpreter, so children use the same installation.
CLI = [sys.executable, "-m", "inference_auctions.server.cli"]
_STOP_GRACE_SECONDS = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Child:
    """One process of the deployment and the URL it serves."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM: a replica stops taking requests and drains the ones it has."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace: float = _STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL if it has not exited after `grace` seconds."""
        self.terminate()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL: a crash, for the fault tests."""
        if self.alive():
            self.process.kill()
        self.process.wait(10)


def _spawn(name: str, command: list[str], env: dict[str, str], log: Path, url: str) -> Child:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        # A session of its own: Ctrl-C in the terminal reaches only the supervisor, which
        # then stops the children in order instead of all of them at once.
        process = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Child(name, url, process, log)


def _clean_environment() -> dict[str, str]:
    # The parent's INFERENCE_AUCTION_* settings would override the options given to a child.
    return {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}


def start_engine(
    name: str,
    port: int,
    log: Path,
    *,
    host: str = "127.0.0.1",
    time_scale: float = 1.0,
    cache_tokens: int | None = None,
    max_running_requests: int | None = None,
) -> Child:
    """`inference-auction emulate-sglang` on `host:port`."""
    command = [*CLI, "emulate-sglang", "--host", host, "--port", str(port)]
    command += ["--time-scale", f"{time_scale:g}", "--log-level", "warning"]
    if cache_tokens is not None:
        command += ["--cache-tokens", str(cache_tokens)]
    if max_running_requests is not None:
        command += ["--max-running-requests", str(max_running_requests)]
    return _spawn(name, command, _clean_environment(), log, f"http://{host}:{port}")


def start_replica(
    name: str,
    port: int,
    engine_url: str,
    database_url: str,
    log: Path,
    *,
    host: str = "127.0.0.1",
    replicas: int = 1,
    settings: dict[str, str] | None = None,
) -> Child:
    """`inference-auction serve` in front of `engine_url`, as replica `name` of `replicas`."""
    env = _clean_environment()
    env.update(
        {
            "INFERENCE_AUCTION_HOST": host,
            "INFERENCE_AUCTION_PORT": str(port),
            "INFERENCE_AUCTION_ENGINE_URL": engine_url,
            "INFERENCE_AUCTION_DATABASE_URL": database_url,
            "INFERENCE_AUCTION_REPLICA_NAME": name,
            "INFERENCE_AUCTION_RATE_LIMIT_REPLICAS": str(replicas),
            # One replica runs the ledger jobs, another takes over if it dies (PostgreSQL).
            "INFERENCE_AUCTION_JOBS_LEADER_ELECTION": "true",
            # SMG, on this machine, is the replicas' proxy: its connections are not one client
            # (each request counts by its key, and by the address SMG forwards if any).
            "INFERENCE_AUCTION_TRUSTED_PROXIES": '["127.0.0.1", "::1"]',
        }
    )
    env.update(
        {f"INFERENCE_AUCTION_{key.upper()}": value for key, value in (settings or {}).items()}
    )
    command = [*CLI, "serve", "--log-level", "warning"]
    return _spawn(name, command, env, log, f"http://{host}:{port}")


def start_router(worker_urls: Sequence[str], options: RouterOptions, log: Path) -> Child:
    """SMG in front of `worker_urls`."""
    command = smg_command(find_smg(), list(worker_urls), options)
    return _spawn("smg", command, dict(os.environ), log, f"http://{options.host}:{options.port}")


def wait_healthy(child: Child, timeout: float = 60.0, path: str = "/health") -> None:
    """Return once `child` answers 200 on `path`; raise with its log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(child.url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.process.returncode}:\n{_tail(child)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{child.name} was not healthy within {timeout:g} s:\n{_tail(child)}"
            )
        time.sleep(0.1)


def wait_routing(router: Child, workers: int, timeout: float = 60.0) -> None:
    """Return once SMG counts `workers` healthy workers (its `/readiness`)."""
    deadline = time.monotonic() + timeout
    healthy = -1
    while True:
        try:
            reply = httpx.get(router.url + "/readiness", timeout=2)
            healthy = int(reply.json().get("healthy_workers", -1))
        except (httpx.TransportError, ValueError):
            healthy = -1
        if healthy == workers:
            return
        if not router.alive():
            raise RuntimeError(f"SMG exited with {router.process.returncode}:\n{_tail(router)}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"SMG saw {healthy} of {workers} workers healthy after {timeout:g} s:\n"
                + _tail(router)
            )
        time.sleep(0.1)


def _tail(child: Child, lines: int = 30) -> str:
    try:
        return "\n".join(child.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class ClusterPlan:
    """What `Cluster` starts: emulated engines unless `engine_urls` names real ones."""

    workers: int
    database_url: str
    log_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    engine_urls: tuple[str, ...] = ()
    time_scale: float = 1.0
    cache_tokens: int | None = None
    policy: str = "cache_aware"
    replica_settings: dict[str, str] = field(default_factory=dict)


@dataclass
class Cluster:
    """A running deployment: its engines (when emulated), replicas and router."""

    plan: ClusterPlan
    engines: list[Child] = field(default_factory=list)
    replicas: list[Child] = field(default_factory=list)
    router: Child | None = None

    @property
    def url(self) -> str:
        """Where clients send requests: SMG."""
        assert self.router is not None
        return self.router.url

    def children(self) -> list[Child]:
        """Every process, in the order to stop them: router, replicas, engines."""
        return [*([self.router] if self.router else []), *self.replicas, *self.engines]

    def dead(self) -> list[Child]:
        """Processes that exited while the deployment should be running."""
        return [child for child in self.children() if not child.alive()]


@contextmanager
def run_cluster(plan: ClusterPlan) -> Iterator[Cluster]:
    """Start the deployment of `plan`, ready to route, and stop all of it when the block ends."""
    # Once, before any replica starts: replicas migrating an empty database at once would race.
    upgrade_schema(plan.database_url)
    cluster = Cluster(plan)
    with ExitStack() as stack:
        stack.callback(_stop_all, cluster)
        engine_urls = list(plan.engine_urls)
        if not engine_urls:
            for index in range(plan.workers):
                engine = start_engine(
                    f"engine-{index}",
                    free_port(plan.host),
                    plan.log_dir / f"engine-{index}.log",
                    host=plan.host,
                    time_scale=plan.time_scale,
                    cache_tokens=plan.cache_tokens,
                )
                cluster.engines.append(engine)
            engine_urls = [engine.url for engine in cluster.engines]
        for index, engine_url in enumerate(engine_urls):
            replica = start_replica(
                f"replica-{index}",
                free_port(plan.host),
                engine_url,
                plan.database_url,
                plan.log_dir / f"replica-{index}.log",
                host=plan.host,
                replicas=len(engine_urls),
                settings=plan.replica_settings,
            )
            cluster.replicas.append(replica)
        for child in [*cluster.engines, *cluster.replicas]:
            wait_healthy(child)
        options = RouterOptions(
            host=plan.host, port=plan.port, prometheus_port=free_port(plan.host), policy=plan.policy
        )
        cluster.router = start_router(
            [replica.url for replica in cluster.replicas], options, plan.log_dir / "smg.log"
        )
        wait_routing(cluster.router, len(cluster.replicas))
        yield cluster


def _stop_all(cluster: Cluster) -> None:
    # Tier by tier, each tier at once: SMG, then the replicas (draining in parallel), then
    # the engines they drained into.
    for tier in ([cluster.router] if cluster.router else [], cluster.replicas, cluster.engines):
        for child in tier:
            child.terminate()
        for child in tier:
            child.stop()
