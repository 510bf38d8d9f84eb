"""The real SGLang 0.5.23 server on this CPU, shared by the tests that need it.

Every test here is marked `sglang` (left out by `make test`, run by CI). The environment is
what `bench/setup_sglang_reference.sh` builds in `~/.cache/inference-auctions` (or
`$INFERENCE_AUCTION_SGLANG_HOME`): CI's `make test` runs the script first. Without it the tests
are skipped with the command that builds it, unless `INFERENCE_AUCTION_REQUIRE_SGLANG=1` (set by
CI), which makes them fail instead.

One SGLang process serves the whole session: priority scheduling, one running request at a
time (`--max-running-requests 1`), so that every request but the running one waits, and the
order in which they wait is what the tests look at. Tests that kill it start it again on the
same port before they end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.sglang_cpu.launcher import (
    SGLangServer,
    environment_ready,
    setup_script,
    sglang_home,
)
from bench.sglang_cpu.tool_model import make_tool_model
from tests.db_fixtures import ledger_db
from tests.server.harness import RunningServer

__all__ = ["assert_ledger_settled", "first_token_at", "ledger_db", "model_dir"]

MAX_RUNNING_REQUESTS = 1
MAX_TOTAL_TOKENS = 16_384
CONTEXT_LENGTH = 2_048  # the tiny model's


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.sglang)


def _require_environment() -> Path:
    home = sglang_home()
    if environment_ready(home):
        return home
    missing = f"no SGLang CPU environment in {home}: run {setup_script()}"
    if os.environ.get("INFERENCE_AUCTION_REQUIRE_SGLANG") == "1":
        pytest.fail(f"{missing} (INFERENCE_AUCTION_REQUIRE_SGLANG=1)", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="session")
def sglang_home_dir() -> Path:
    """SGLang's environment; skips (fails under CI) when it has not been built."""
    return _require_environment()


@pytest.fixture(scope="session")
def sglang(
    sglang_home_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SGLangServer]:
    """The session's SGLang server (see the module docstring)."""
    server = SGLangServer(
        home=sglang_home_dir,
        max_total_tokens=MAX_TOTAL_TOKENS,
        max_running_requests=MAX_RUNNING_REQUESTS,
        log_path=tmp_path_factory.mktemp("sglang") / "sglang.log",
        startup_deadline=300,
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()  # nothing to drain; a graceful stop waits about five seconds


@pytest.fixture(scope="session")
def sglang_tools(
    sglang_home_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SGLangServer]:
    """A second SGLang, started only for the tests that ask for it: the tiny model with a
    chat template that renders tools (`bench.sglang_cpu.tool_model`), and JSON constrained
    without free whitespace (random weights would otherwise fill a JSON answer with blanks up
    to `max_tokens`). No `--tool-call-parser`: the auction server reads calls itself (SGLang's
    `/generate` parses none), and without one SGLang's own chat route forces `required` and
    named calls with the same JSON-schema constraint as the server (leaving them as text),
    which the tests compare."""
    folder = tmp_path_factory.mktemp("sglang-tools")
    server = SGLangServer(
        home=sglang_home_dir,
        model=make_tool_model(sglang_home_dir / "model", folder / "model"),
        max_total_tokens=MAX_TOTAL_TOKENS,
        extra_args=["--constrained-json-disable-any-whitespace"],
        log_path=folder / "sglang.log",
        startup_deadline=300,
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def sglang_url(sglang: SGLangServer) -> str:
    """The URL of a running SGLang, restarted first if an earlier test left it dead; its
    prefix cache emptied so that each test sees only its own prefixes."""
    if not sglang.alive():
        sglang.start()
    httpx.post(sglang.url + "/flush_cache", timeout=30)
    return sglang.url


def model_dir(sglang: SGLangServer) -> Path:
    """The folder of the model SGLang serves (its tokenizer.json and chat template)."""
    return sglang.model


def assert_ledger_settled(server: RunningServer, users: list[str]) -> None:
    """The ledger reconciles, and no user has money still held: every request is settled."""
    report = server.ledger.reconcile()
    assert report.ok, report.drifts
    for user in users:
        balance = server.ledger.balance(user)
        assert balance.held_micros == 0, (user, balance)


def first_token_at(meta_info: dict[str, object]) -> float:
    """When SGLang produced the request's first token, on its own clock (`--enable-metrics`)."""
    received = meta_info["request_received_ts"]
    latency = meta_info["first_token_latency"]
    assert isinstance(received, float) and isinstance(latency, float), meta_info
    return received + latency
