"""`serve`'s start banner, followed as printed against the server that printed it, in each
pricing mode: the user it creates, the request it suggests and the balance it points to all
work, and the server logs nothing else at start unless asked to."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from inference_auctions.server.cli import main
from inference_auctions.server.cli.first_steps import command_name, first_steps
from inference_auctions.server.settings import ServerSettings
from tests.processes import free_port, wait_until_healthy


@contextmanager
def _serve(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`inference-auction serve ARGS` on a free port; yields the process and its banner."""
    port = free_port()
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(port), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
        banner = ""
        assert process.stdout is not None
        while not banner.rstrip().endswith("more)"):  # the banner's last line
            line = process.stdout.readline()
            assert line, f"the banner ended early:\n{banner}"
            banner += line
        yield process, banner
    finally:
        process.terminate()
        process.wait(30)


def _steps(banner: str, starts: str) -> list[str]:
    """The banner's command lines that start with `starts`, continuation lines joined."""
    lines, commands = banner.splitlines(), []
    for number, line in enumerate(lines):
        if line.strip().startswith(starts):
            command, at = line.strip(), number
            while command.endswith("\\"):
                at += 1
                command = command[:-1] + " " + lines[at].strip()
            commands.append(command)
    assert commands, f"no line starting with {starts!r} in:\n{banner}"
    return commands


def _run_tool(command: str) -> str:
    """A suggested `inference-auction ...` command, run in this process; its output."""
    words = shlex.split(command.split("  (", maxsplit=1)[0])
    assert words[0] == command_name(), words
    result = CliRunner().invoke(main, words[1:])
    assert result.exit_code == 0, result.output
    return result.output


def _curl(command: str, key: str) -> httpx.Response:
    """A suggested `curl -s URL -H ... [-d BODY]`, sent with httpx and the user's key."""
    words = shlex.split(command.replace("$KEY", key))
    assert words[:2] == ["curl", "-s"], words
    url, headers = words[2], dict([words[words.index("-H") + 1].split(": ", 1)])
    if "-d" in words:
        body = json.loads(words[words.index("-d") + 1])
        return httpx.post(url, json=body, headers=headers, timeout=60)
    return httpx.get(url, headers=headers, timeout=60)


@pytest.mark.parametrize("pricing", ["auction", "tiers", "fcfs"])
def test_each_modes_banner_suggests_commands_that_work_against_it(
    pricing: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _serve("--pricing", pricing, "--database-url", url) as (process, banner):
        assert f"pricing: {pricing}" in banner
        (create,) = _steps(banner, f"{command_name()} users create alice")
        created = _run_tool(create)
        key = re.search(r"iak_\S+", created)
        assert key is not None, created
        generate, balance_step = _steps(banner, "curl -s http://127.0.0.1:")
        answer = _curl(generate, key.group())
        assert answer.status_code == 200, answer.text
        auction = answer.json()["meta_info"]["auction"]
        balance = _curl(balance_step, key.group())
        if pricing == "tiers":
            assert auction["service_tier"] == "priority"
            assert auction["request_charge_micros"] == 5_000  # the dearest tier's price
            assert '"bid"' not in banner and '"service_tier": "priority"' in banner
        elif pricing == "fcfs":
            assert auction["bid_micros"] == 0 and auction["request_charge_micros"] == 0
            assert '"bid"' not in banner
        else:
            assert auction["bid_micros"] == 50_000 and auction["request_charge_micros"] == 0
        assert balance.status_code == 200, balance.text
        assert balance.json()["spent_this_period_micros"] == auction["request_charge_micros"]
        process.terminate()
        access_log, log = process.communicate(timeout=30)
    # Quiet by default: no start-up chatter, no access log; the emulator's warning stays.
    assert "INFO" not in log + access_log, log + access_log
    assert "embedded SGLang EMULATOR" in log


def test_log_level_info_still_shows_the_start_up_and_each_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with _serve("--database-url", url, "--log-level", "info") as (process, banner):
        base = re.search(r"serving on (\S+)", banner)
        assert base is not None
        httpx.get(base.group(1) + "/health", timeout=30)
        process.terminate()
        access_log, log = process.communicate(timeout=30)  # uvicorn's access log: stdout
    assert "Running upgrade" in log, log
    assert '"GET /health HTTP/1.1" 200' in access_log, access_log


def test_the_tool_is_named_as_the_shell_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Path(sys.prefix) / "bin" / "inference-auction"
    assert script.exists()
    monkeypatch.setenv("PATH", str(tmp_path))  # not on PATH: named by its path
    monkeypatch.chdir(Path(sys.prefix).parent)
    assert command_name() == f"{Path(sys.prefix).name}/bin/inference-auction"
    monkeypatch.chdir(tmp_path)
    assert command_name() == str(script)
    monkeypatch.setenv("PATH", str(script.parent))  # an activated environment
    assert command_name() == "inference-auction"
    assert "  inference-auction users create alice" in first_steps(ServerSettings())
