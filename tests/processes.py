"""Helpers for tests that run servers: a free loopback port, and waiting for `/health`."""

from __future__ import annotations

import socket
import subprocess
import time

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
