"""`inference-auction emulate-sglang` serves the emulator with SGLang's API, and stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner

from inference_auctions.server.cli import main
from tests.processes import free_port


def test_the_command_is_registered_and_documented() -> None:
    result = CliRunner().invoke(main, ["emulate-sglang", "--help"])
    assert result.exit_code == 0
    assert "EMULATOR (not SGLang)" in result.output
    assert "--cache-tokens" in result.output


def test_invalid_settings_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["emulate-sglang", "--time-scale", "0"])
    assert result.exit_code == 2
    assert "time_scale must be > 0" in result.output


def test_emulate_sglang_serves_until_interrupted() -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "inference_auctions.server.cli",
        "emulate-sglang",
        "--port",
        str(port),
        "--time-scale",
        "0.01",
        "--cache-tokens",
        "5000",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=url, timeout=5) as client:
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "the emulator did not start"
                time.sleep(0.05)
            info = client.get("/server_info").json()
            assert info["max_total_num_tokens"] == 5000
            body = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
            assert client.post("/generate", json=body).json()["meta_info"]["completion_tokens"] == 2
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert "SGLang EMULATOR (not SGLang" in output
