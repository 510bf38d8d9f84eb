"""docs/guides/front-your-sglang.md, followed step by step against the real SGLang on this CPU.

The guide's own commands are read from its code blocks and run as an operator would run them,
with only what names this machine substituted: the model (the tiny CPU model), the ports, the
database (a SQLite file rather than the guide's PostgreSQL) and the CLI's path. SGLang is
started with the guide's flags (its `--api-key` included) on top of what the CPU needs, the
auction server with the guide's `serve` line and environment, the callers' keys with its
`users create` lines; then a caller uses the openai client as the guide says. A guide whose
commands stop working, or whose steps miss one, fails here.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.serving_processes import Service, free_port, start_service
from bench.sglang_cpu.launcher import SGLangServer

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "front-your-sglang.md"
CLI = [sys.executable, "-m", "inference_auctions.server.cli"]


def guide_commands() -> list[list[list[str]]]:
    """Each bash block of the guide, as its commands (continuation lines joined, comments
    dropped), each command as its words with the shell's variables left as written."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    commands = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        lines = [shlex.split(line, comments=True) for line in joined.splitlines()]
        commands.append([words for words in lines if words])
    return commands


def after(words: list[str], marker: str) -> list[str]:
    """The words after `marker` (the program and its subcommand)."""
    return words[words.index(marker) + 1 :]


def without_option(words: list[str], option: str) -> list[str]:
    """`words` less `option` and its value."""
    if option not in words:
        return words
    at = words.index(option)
    return words[:at] + words[at + 2 :]


def replace_value(words: list[str], option: str, value: str) -> list[str]:
    """`words` with `option`'s value replaced; the test fails if the guide has no such option."""
    assert option in words, f"the guide's command has no {option}: {words}"
    at = words.index(option)
    return [*words[: at + 1], value, *words[at + 2 :]]


@pytest.fixture(scope="module")
def engine_key() -> str:
    return "sk-engine-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def guarded_sglang(
    sglang_home_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_key: str
) -> Iterator[SGLangServer]:
    """Step 1: SGLang restarted with the guide's flags (its own, not the launcher's)."""
    launch = next(w for block in guide_commands() for w in block if "sglang.launch_server" in w)
    flags = after(launch, "sglang.launch_server")
    flags = without_option(without_option(flags, "--model-path"), "--port")
    flags = [engine_key if word == "$SGLANG_KEY" else word for word in flags]
    assert "--enable-priority-scheduling" in flags and "--api-key" in flags, flags
    server = SGLangServer(
        home=sglang_home_dir,
        priority_scheduling=False,  # the guide's flags say it
        max_running_requests=1,
        extra_args=flags,
        log_path=tmp_path_factory.mktemp("guide-sglang") / "sglang.log",
        startup_deadline=300,
    )
    # The launcher's readiness probe asks /health, which SGLang serves without the key.
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def auction(
    guarded_sglang: SGLangServer, engine_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, dict[str, str], Path]]:
    """Step 2: the auction server, with the guide's environment and `serve` line."""
    folder = tmp_path_factory.mktemp("guide-auction")
    commands = guide_commands()
    step = next(block for block in commands if any("serve" in words for words in block))
    # Only what the guide exports: a step that forgets a variable fails here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    database_url = f"sqlite:///{folder / 'ledger.db'}"
    for words in step:
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            # The guide's values name its hosts; here the key is this test's and the
            # database a SQLite file.
            if value == "$SGLANG_KEY":
                value = engine_key
            elif name == "INFERENCE_AUCTION_DATABASE_URL":
                value = database_url
            env[name] = value
    serve = next(words for words in step if "serve" in words)
    arguments = after(serve, "serve")
    arguments = replace_value(arguments, "--engine-url", guarded_sglang.url)
    port = free_port()
    arguments = replace_value(arguments, "--port", str(port))
    if "--database-url" in arguments:
        arguments = replace_value(arguments, "--database-url", database_url)
    service = start_service(
        "auction",
        [*CLI, "serve", *arguments],
        url=f"http://127.0.0.1:{port}",
        health_path="/health",
        log_dir=folder,
        env={k: v for k, v in env.items() if k.startswith("INFERENCE_AUCTION_")},
        timeout=180,
    )
    try:
        yield service, env, folder
    finally:
        service.stop()


def create_keys(env: dict[str, str], folder: Path) -> dict[str, str]:
    """Step 3: the guide's `users create` lines, run as written, in the shell step 2 left
    (its environment; a command that missed the server's database would make a ledger of its
    own in `folder`); each user's key as printed."""
    keys = {}
    block = next(b for b in guide_commands() if any("users" in words for words in b))
    for words in block:
        arguments = after(words, "users")
        run = subprocess.run(
            [*CLI, "users", *arguments, "--format", "json"],
            env=env,
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, (words, run.stderr)
        keys[arguments[1]] = _api_key(run.stdout)
    return keys


def _api_key(output: str) -> str:
    match = re.search(r'"api_key":\s*"([^"]+)"', output)
    assert match, output
    return match.group(1)


def test_the_guide_run_as_written_serves_callers_through_the_auction(
    guarded_sglang: SGLangServer,
    auction: tuple[Service, dict[str, str], Path],
    engine_key: str,
    request: pytest.FixtureRequest,
) -> None:
    service, env, folder = auction
    keys = create_keys(env, folder)
    assert set(keys) == {"team-a", "root"}

    # SGLang now refuses callers without its key: the server's requests go through because
    # it sends the key as SGLang expects.
    direct = httpx.post(
        guarded_sglang.url + "/generate",
        json={"text": "hello", "sampling_params": {"max_new_tokens": 1}},
        timeout=60,
    )
    assert direct.status_code == 401, direct.text

    caller = openai.OpenAI(base_url=service.url + "/v1", api_key=keys["team-a"], timeout=120)
    request.addfinalizer(caller.close)
    engine_model = httpx.get(
        guarded_sglang.url + "/v1/models",
        headers={"Authorization": f"Bearer {engine_key}"},
        timeout=30,
    ).json()["data"][0]["id"]
    paid = caller.chat.completions.create(
        model=engine_model,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=4,
        extra_body={"bid": "0.05"},
    )
    assert paid.model == engine_model  # the model learnt from the engine, not a placeholder
    assert paid.choices[0].message.content is not None
    free = caller.completions.create(model=engine_model, prompt="Count: one,", max_tokens=4)
    assert free.choices[0].text is not None  # no bid: served at bid 0, as step 4 says

    with pytest.raises(openai.NotFoundError) as wrong_model:
        caller.completions.create(model="not-this-one", prompt="x", max_tokens=1)
    assert wrong_model.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bid_elsewhere:
        caller.completions.create(
            model=engine_model, prompt="x", max_tokens=1, extra_body={"bid_micros": 5}
        )
    assert "bid" in str(bid_elsewhere.value)

    # The money: the bidder paid at most its bid, the ledger reconciles, nothing is held.
    ledger = subprocess.run(
        [*CLI, "ledger", "reconcile"],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ledger.returncode == 0, ledger.stdout + ledger.stderr
    balance = httpx.get(
        service.url + "/v1/ledger/balance",
        headers={"Authorization": f"Bearer {keys['team-a']}"},
        timeout=30,
    ).json()
    assert balance["held_micros"] == 0, balance
    assert 0 <= balance["spent_this_period_micros"] <= 50_000, balance

    # The engine's key is in no log line.
    assert engine_key not in service.log.read_text()
