"""Start the real SGLang server on a CPU, with a start-up deadline, and stop it by its PID.

    python -m bench.sglang_cpu.launcher [--model DIR] [--max-running-requests N] [-- SERVE...]

runs the whole product on the real engine: SGLang (from the environment that
`bench/setup_sglang_reference.sh` builds) on one loopback port, then `inference-auction serve
--engine-url` in front of it, until Ctrl-C stops both (`make run-sglang`). Tests use
`SGLangServer` directly.

Why a launcher of its own: SGLang's CPU platform turns on only with `SGLANG_USE_CPU_ENGINE=1`;
a scheduler subprocess that dies at start-up leaves `launch_server` alive and silent, so the
start waits for `/health` under a deadline and, past it or when the launcher exits, kills the
whole process group it started (`start_new_session`), never anything by name. `--sleep-on-idle`
keeps the idle scheduler from spinning a core; `--max-total-tokens` bounds the KV pool (without
it SGLang takes 72% of free memory). `stop` is SGLang's graceful stop (it drains requests, and
notices the signal only at its watchdog's next 5-second tick); `kill` is immediate.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

__all__ = [
    "DEFAULT_MAX_TOTAL_TOKENS",
    "SGLangServer",
    "SGLangStartError",
    "python_of",
    "sglang_home",
]

DEFAULT_MAX_TOTAL_TOKENS = 16_384
_HOME_VARIABLE = "INFERENCE_AUCTION_SGLANG_HOME"
_STOP_SECONDS = 15.0
_REPO = Path(__file__).resolve().parents[2]


def sglang_home() -> Path:
    """Where `bench/setup_sglang_reference.sh` builds SGLang's environment by default."""
    configured = os.environ.get(_HOME_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "inference-auctions" / "sglang-cpu-0.5.23"


def python_of(home: Path) -> Path:
    """The Python of SGLang's virtualenv in `home`."""
    return home / ".venv" / "bin" / "python"


def setup_script() -> Path:
    """The script that builds the environment (a no-op once it is complete)."""
    return _REPO / "bench" / "setup_sglang_reference.sh"


def environment_ready(home: Path) -> bool:
    """Whether the setup script finished in `home` (it writes `.complete` last)."""
    return (home / ".complete").is_file() and python_of(home).is_file()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class SGLangStartError(RuntimeError):
    """SGLang did not answer `/health` within its deadline, or exited first."""


def _has_weights(model: Path) -> bool:
    return any(model.glob("*.safetensors")) or any(model.glob("*.bin"))


class SGLangServer:
    """One SGLang server process tree on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        *,
        home: Path | None = None,
        model: Path | None = None,
        port: int | None = None,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        max_running_requests: int | None = None,
        priority_scheduling: bool = True,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        startup_deadline: float = 180.0,
    ) -> None:
        self.home = home or sglang_home()
        self.model = model or self.home / "model"
        self.port = port or free_port()
        self.max_total_tokens = max_total_tokens
        self.max_running_requests = max_running_requests
        self.priority_scheduling = priority_scheduling
        self.extra_args = list(extra_args)
        self.log_path = log_path
        self.startup_deadline = startup_deadline
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None  # seconds from launch to a healthy server

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The `launch_server` command line."""
        command = [str(python_of(self.home)), "-m", "sglang.launch_server"]
        command += ["--model-path", str(self.model), "--device", "cpu"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--attention-backend", "torch_native"]
        command += ["--max-total-tokens", str(self.max_total_tokens)]
        command += ["--sleep-on-idle", "--enable-cache-report", "--enable-metrics"]
        # Its warm-up request only delays readiness (a fixed sleep, then a generation): the
        # start waits for `/health`, which generates a token itself.
        command += ["--skip-server-warmup"]
        command += ["--log-level", "warning"]
        if not _has_weights(self.model):
            command += ["--load-format", "dummy"]
        if self.priority_scheduling:
            command += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
        if self.max_running_requests is not None:
            command += ["--max-running-requests", str(self.max_running_requests)]
        return command + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: the CPU engine on, offline, no proxy for loopback."""
        env = dict(os.environ)
        env.update(
            SGLANG_USE_CPU_ENGINE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            PYTHONWARNINGS="ignore",
        )
        env.pop("PYTHONPATH", None)  # the project's modules have no business in SGLang's venv
        return env

    def start(self) -> None:
        """Launch and wait for `/health`; on a failure everything started is stopped."""
        if not environment_ready(self.home):
            raise SGLangStartError(
                f"no SGLang environment in {self.home}: run {setup_script()} first"
            )
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self.log_path.open("ab")
        else:
            log = None
        began = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped as one
            )
        finally:
            if log is not None:
                log.close()
        try:
            self._wait_healthy(began)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def _wait_healthy(self, began: float) -> None:
        assert self.process is not None
        deadline = began + self.startup_deadline
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                if self.process.poll() is not None:
                    raise SGLangStartError(
                        f"SGLang exited with {self.process.returncode} while starting"
                        + self._log_tail()
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + "/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise SGLangStartError(
                        f"SGLang did not answer /health within {self.startup_deadline:g} s"
                        + self._log_tail()
                    )
                time.sleep(0.25)

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        return "; its log ends:\n" + "\n".join(lines)

    def alive(self) -> bool:
        """Whether the launcher process is still running."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group at once (an engine crash, for tests)."""
        self._signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(_STOP_SECONDS)

    def stop(self) -> None:
        """SIGTERM the process group; SIGKILL what is left after a grace period."""
        process = self.process
        if process is None:
            return
        self._signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_STOP_SECONDS)
        # The scheduler and detokenizer may outlive the launcher: the group goes as one.
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_STOP_SECONDS)

    def _signal(self, number: signal.Signals) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, number)

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _arguments(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sglang_cpu.launcher",
        description="Run the auction server in front of the real SGLang on this CPU.",
    )
    parser.add_argument("--model", type=Path, help="model folder (default: the tiny Llama)")
    parser.add_argument("--home", type=Path, help="SGLang's environment (default: the cache)")
    parser.add_argument("--sglang-port", type=int, default=30_000)
    parser.add_argument("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS)
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--startup-deadline", type=float, default=180.0)
    parser.add_argument("--log", type=Path, help="SGLang's log file (default: none)")
    arguments = list(argv)
    split = arguments.index("--") if "--" in arguments else len(arguments)
    return parser.parse_args(arguments[:split]), arguments[split + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    """Start SGLang, then `inference-auction serve` in front of it, until interrupted."""
    args, serve_args = _arguments(list(sys.argv[1:] if argv is None else argv))
    server = SGLangServer(
        home=args.home,
        model=args.model,
        port=args.sglang_port,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        startup_deadline=args.startup_deadline,
        log_path=args.log,
    )
    print(f"starting SGLang on {server.url} with {server.model} ...", flush=True)
    with server:
        print(f"SGLang is up in {server.started_in:.0f} s", flush=True)
        # The project's own command, beside this interpreter (make runs it from .venv).
        beside = Path(sys.executable).parent / "inference-auction"
        serve = str(beside) if beside.is_file() else shutil.which("inference-auction")
        if serve is None:
            raise SystemExit("no inference-auction command: run make first")
        command = [serve, "serve", "--engine-url", server.url, *serve_args]
        print("running:", " ".join(command), flush=True)
        child = subprocess.Popen(command)
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            return child.wait()


if __name__ == "__main__":
    sys.exit(main())
