"""SGLang's own clients through the server, in front of the real SGLang: its load generator
`bench_serving` and its frontend language (`gen`, `run_batch`, `select`), unchanged, each run
by its script in SGLang's virtualenv; each script ends by checking that no money is held and
that the ledger reconciles."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.sglang_cpu.launcher import SGLangServer

# Two minutes of the real engine: run by hand (`python -m pytest -m sglang_clients`), not by CI.
pytestmark = pytest.mark.sglang_clients

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "env"),
    [
        (
            "run_sglang_bench_serving.sh",
            # Short prompts: the tiny model's context is 2048 tokens.
            {
                "GSP_GROUPS": "2",
                "GSP_PROMPTS_PER_GROUP": "8",
                "GSP_SYSTEM_PROMPT_LEN": "64",
                "GSP_QUESTION_LEN": "16",
            },
        ),
        ("run_sglang_frontend.sh", {}),
    ],
)
def test_sglangs_own_clients_through_the_server(
    sglang: SGLangServer, sglang_url: str, script: str, env: dict[str, str]
) -> None:
    run = subprocess.run(
        ["bash", str(REPO / "bench" / script), str(sglang.home)],
        env={**os.environ, **env, "INFERENCE_AUCTION_ENGINE_URL": sglang_url},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The script's last check: `ledger reconcile`, after no money was left held.
    assert "agree with their entries" in run.stdout, run.stdout[-2000:]
