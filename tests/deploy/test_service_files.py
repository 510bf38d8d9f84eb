"""deploy/'s systemd unit and compose files: valid, and their stop timeouts longer than the
drain they wait for.

The unit is checked by `systemd-analyze verify` (skipped without systemd) with its
`/opt/inference-auctions` commands pointed at this checkout's installed ones, since verify
insists that they exist. The compose files are read as YAML and checked for what the server
needs: `podman-compose` has no `config` command before 1.1, and Docker's is not on every
machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).parents[2] / "deploy"
UNIT = DEPLOY / "systemd" / "inference-auction.service"


def _env_file() -> dict[str, str]:
    lines = (DEPLOY / "systemd" / "inference-auction.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def _unit() -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            entries.setdefault(key, value)
    return entries


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "inference-auction").exists()
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/inference-auctions/bin/", f"{bin_dir}/"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_the_unit_stops_after_the_drain() -> None:
    unit = _unit()
    assert unit["EnvironmentFile"] == "/etc/inference-auction/env"
    assert unit["KillSignal"] == "SIGTERM"
    drain = float(_env_file()["INFERENCE_AUCTION_ENGINE_MAX_SECONDS"])
    assert float(unit["TimeoutStopSec"]) > drain
    assert "serve" in unit["ExecStart"] and "db upgrade" in unit["ExecStartPre"]
    assert unit["User"] == "auction"


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match[1])


def test_compose_runs_the_server_after_the_schema_on_postgresql() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "server"}
    server, migrate = services["server"], services["migrate"]
    assert migrate["command"] == ["db", "upgrade"]
    assert migrate["build"]["dockerfile"] == "deploy/Containerfile"
    assert (DEPLOY.parent / migrate["build"]["context"].removeprefix("../")).is_dir()
    assert server["image"] == migrate["image"]
    assert server["build"] == migrate["build"]  # built here, never pulled
    assert server["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    environment = server["environment"]
    assert environment["INFERENCE_AUCTION_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert environment["INFERENCE_AUCTION_DATABASE_URL"].endswith("@postgres:5432/auction")
    drain = float(environment["INFERENCE_AUCTION_ENGINE_MAX_SECONDS"])
    assert _seconds(server["stop_grace_period"]) > drain
    assert "ledger" in compose["volumes"]


def test_compose_with_sglang_points_the_server_at_it() -> None:
    sglang = yaml.safe_load((DEPLOY / "compose.sglang.yaml").read_text())["services"]
    command = sglang["sglang"]["command"]
    assert "--enable-priority-scheduling" in command
    assert "--schedule-low-priority-values-first" in command
    port = command[command.index("--port") + 1]
    url = sglang["server"]["environment"]["INFERENCE_AUCTION_ENGINE_URL"]
    assert url == f"http://sglang:{port}"
    assert sglang["server"]["depends_on"]["sglang"]["condition"] == "service_healthy"
