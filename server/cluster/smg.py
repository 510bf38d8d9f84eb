"""SMG, the router in front of the replicas: finding its executable and its command line."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = (
    "SMG (the SGLang model gateway) is not installed: `pip install smg` (it ships the router "
    "binary in a wheel), or `pip install -e '.[dev]'` in a checkout of this project"
)


class SMGMissing(RuntimeError):
    """The `smg` executable is on neither this interpreter's bin directory nor PATH."""


def find_smg() -> str:
    """The `smg` executable: beside this Python first (a virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / "smg"
    if beside.is_file():
        return str(beside)
    found = shutil.which("smg")
    if found is None:
        raise SMGMissing(INSTALL_HINT)
    return found


@dataclass(frozen=True)
class RouterOptions:
    """How SMG routes and watches the replicas."""

    host: str
    port: int
    prometheus_port: int
    policy: str = "cache_aware"
    # SMG's defaults (60 s between probes, 3 failures) keep a dead replica in rotation for
    # minutes; a replica that stops answering should leave within seconds.
    health_check_interval_seconds: int = 1
    health_failure_threshold: int = 1
    health_success_threshold: int = 1


def smg_command(executable: str, worker_urls: list[str], options: RouterOptions) -> list[str]:
    """`smg launch` in front of `worker_urls`."""
    return [
        executable,
        "launch",
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        options.policy,
        "--prometheus-host",
        options.host,
        "--prometheus-port",
        str(options.prometheus_port),
        "--health-check-interval-secs",
        str(options.health_check_interval_seconds),
        "--health-failure-threshold",
        str(options.health_failure_threshold),
        "--health-success-threshold",
        str(options.health_success_threshold),
        "--disable-tokenizer-autoload",
        "--log-level",
        "warn",
    ]
