"""`inference-auction cluster`: a whole deployment from one command, gone on Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from inference_auctions.billing import Ledger
from inference_auctions.server.cli import main
from inference_auctions.server.cluster.supervisor import CLI, free_port
from tests.cluster.helpers import generate, replica_of, wait_until
from tests.db_fixtures import MigratedDatabase


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return None if fields is None else fields[19]  # starttime: tells a reused pid apart


def _alive(pid: int, started: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[19] == started and fields[0] != "Z"


@pytest.mark.cluster
@pytest.mark.postgres
@pytest.mark.timeout(150)
def test_cluster_starts_workers_replicas_and_smg_and_ctrl_c_stops_them_all(
    postgres_db: MigratedDatabase, smg: str, tmp_path: Path
) -> None:
    del smg
    port = free_port()
    output = tmp_path / "cluster.out"
    command = [*CLI, "cluster", "--workers", "2", "--port", str(port), "--time-scale", "0.01"]
    command += ["--database-url", postgres_db.url, "--log-dir", str(tmp_path / "logs")]
    with output.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    children: dict[int, str] = {}
    try:
        wait_until(
            lambda: "Ctrl-C stops everything." in output.read_text() or process.poll() is not None,
            120,
            "the deployment ready",
        )
        assert process.poll() is None, output.read_text()
        children = {pid: _started(pid) or "" for pid in _children(process.pid)}
        assert len(children) == 5, output.read_text()  # 2 workers, 2 auction servers, SMG
        printed = output.read_text()
        assert f"SMG (cache_aware) on http://127.0.0.1:{port}" in printed
        assert "replica-0: http://127.0.0.1:" in printed and "replica-1:" in printed

        key = Ledger(postgres_db.engine).create_user("alice", budget_micros=10**6).api_key
        served = {
            replica_of(reply)
            for reply in (
                generate(f"http://127.0.0.1:{port}", key, f"topic {i} " * 40) for i in range(6)
            )
            if reply.status_code == 200
        }
        assert served and served <= {"replica-0", "replica-1"}

        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, output.read_text()
        assert time.monotonic() - started < 60
        assert "Stopped SMG, then the auction servers" in output.read_text()
        # Ctrl-C reached the command alone (its children run in sessions of their own), and
        # it stopped every one of them.
        assert not [pid for pid, started in children.items() if _alive(pid, started)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for pid, started in children.items():  # in sessions of their own: leave none behind
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_one_engine_url_per_worker() -> None:
    result = CliRunner().invoke(
        main,
        ["cluster", "--workers", "3", "--engine-url", "http://a:1", "--engine-url", "http://b:1"],
    )
    assert result.exit_code == 2
    assert "--workers 3 but 2 --engine-url: give one URL per worker" in result.output
