"""Helpers for tests that run servers: a free loopback port, waiting for `/health`, and the
SGLang emulator as a process of its own."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_healthy(
    url: str, process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30
) -> None:
    """Return once `url/health` answers 200; raise if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server at {url} did not become healthy in {timeout} s")
        time.sleep(0.05)


@contextmanager
def emulated_sglang(time_scale: float, max_running_requests: int | None = None) -> Iterator[str]:
    """An `emulate-sglang` process on a free loopback port; yields its URL, stops it after."""
    port = free_port()
    command = [sys.executable, "-m", "inference_auctions.server.cli", "emulate-sglang"]
    command += ["--port", str(port), "--time-scale", str(time_scale)]
    if max_running_requests is not None:
        command += ["--max-running-requests", str(max_running_requests)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        assert process.stderr is not None
        process.stderr.close()
