"""The serving benchmark's processes: start one, wait until it answers, read its CPU time, stop it.

Each service runs in a session of its own, so stopping it stops whatever it forked (LiteLLM's
proxy may start workers), and its CPU time is summed over its whole process tree.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Service:
    """A started server process, its base URL and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process and all its descendants, so far."""
        return tree_cpu_seconds(self.process.pid)

    def stop(self, timeout: float = 20) -> None:
        """Stop the service's whole session: SIGTERM, then SIGKILL after `timeout`."""
        if self.process.poll() is not None:
            return
        group = self.process.pid  # the session leader's id is the group's
        try:
            os.killpg(group, signal.SIGTERM)
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout)
        except ProcessLookupError:
            pass


def settle(services: Sequence[Service], busy: float = 0.05, limit: float = 120) -> float:
    """Wait until every service is idle (under `busy` CPU-seconds per second, over 0.25 s):
    a warm-up leaves requests queued that would otherwise eat into the measured run. Returns
    the seconds waited."""
    started = time.monotonic()
    window = 0.25
    while time.monotonic() - started < limit:
        before = [s.cpu_seconds() for s in services]
        time.sleep(window)
        spent = [s.cpu_seconds() - b for s, b in zip(services, before, strict=True)]
        if max(spent) < busy * window:
            break
    return time.monotonic() - started


def start_service(
    name: str,
    command: Sequence[str],
    *,
    url: str,
    health_path: str,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> Service:
    """Start `command` (in `cwd`, by default this process's) and return once `url +
    health_path` answers 200; raise (with the tail of its log) if it exits or time runs out."""
    log = log_dir / f"{name}.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            list(command),
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    service = Service(name, process, url, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + health_path, timeout=2).status_code == 200:
                return service
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            service.stop()
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} did not start (see {log}):\n{tail}")
        time.sleep(0.2)


def _stat_fields(pid: int, thread: int | None = None) -> list[str] | None:
    """The fields after the command name of a process's stat (or of one of its threads')."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    # The command name, field 2, is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def _parents() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every live process (read from each one's stat)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def tree_cpu_seconds(root: int) -> float:
    """utime + stime (all threads) of `root` and its live descendants, plus what the children
    they have already reaped used (cutime + cstime), from /proc, in seconds."""
    tree = _parents()
    ticks = 0
    pending = [root]
    while pending:
        pid = pending.pop()
        fields = _stat_fields(pid)
        if fields is None:
            continue
        # After the name: state is field 3, so utime (14) .. cstime (17) sit at 11..14.
        ticks += sum(int(value) for value in fields[11:15])
        pending += tree.get(pid, [])
    return ticks / _TICKS


def main_thread_cpu_seconds(pid: int) -> float:
    """utime + stime of the process's main thread alone (for the auction server: its event
    loop), from /proc, in seconds; 0 once the process is gone."""
    fields = _stat_fields(pid, thread=pid)  # the main thread's id is the process's
    if fields is None:
        return 0.0
    return sum(int(value) for value in fields[11:13]) / _TICKS
