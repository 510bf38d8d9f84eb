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

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "env"),
    [
        (
            "run_sglang_bench_serving.sh",
            # Small: the tiny model's context is 2048 tokens, and the time goes to starting
            # processes, not to the requests; two groups still share their prefixes.
            {
                "GSP_GROUPS": "2",
                "GSP_PROMPTS_PER_GROUP": "4",
                "GSP_SYSTEM_PROMPT_LEN": "64",
                "GSP_QUESTION_LEN": "16",
                "GSP_OUTPUT_LEN": "4",
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
