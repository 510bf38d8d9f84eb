"""Replicas on one ledger clear under one rule whatever their names: two servers both called
`0.0.0.0:8000` (the default name of every host started with `--host 0.0.0.0`) with request
fees 0 and 1,000 must not both serve, and a refused start says why in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inference_auctions.billing import Ledger, RuleDisagreement
from inference_auctions.server.cluster.rule_agreement import RuleAgreement
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.processes import free_port
from tests.server.harness import TEST_SETTINGS, running_server
from tests.server.money_audit import audit_money_against_answers

DEFAULT_NAME = "0.0.0.0:8000"


def _serve_refused(database_url: str, **settings: object) -> subprocess.CompletedProcess[str]:
    """The real `serve` command on the ledger, which must refuse to start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_AUCTION_")}
    env["INFERENCE_AUCTION_DATABASE_URL"] = database_url
    for name, value in settings.items():
        env[f"INFERENCE_AUCTION_{name.upper()}"] = str(value)
    command = [sys.executable, "-m", "inference_auctions.server.cli", "serve"]
    command += ["--port", str(free_port())]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.anyio
async def test_two_replicas_of_one_default_name_and_other_fees_do_not_both_serve(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: rule agreement compared other names' rows only, so the second 0.0.0.0:8000
    # started with fee 1,000 beside the first with fee 0 (and overwrote its row); when a
    # replica of that name stopped it deleted the shared row, and a third with fee 5,000
    # started beside the first. The refusal printed a traceback under its message.
    with running_server(ledger_db, replica_name=DEFAULT_NAME) as first:
        refused = _serve_refused(ledger_db.url, replica_name=DEFAULT_NAME, request_fee_micros=1_000)
        assert refused.returncode == 3  # uvicorn's status for a start that failed
        errors = [line for line in refused.stderr.splitlines() if "ERROR" in line]
        assert len(errors) == 1, refused.stderr
        assert "not starting: replica '0.0.0.0:8000' on this ledger clears under" in errors[0]
        assert "a request fee of 0 micro-credits, this one under" in errors[0]
        assert f"process {os.getpid()} on " in errors[0]  # the first runs in this process
        assert "Traceback" not in refused.stderr

        # A twin under the same rule runs beside it; its stop leaves the first's row.
        base = {**TEST_SETTINGS, "database_url": ledger_db.url, "replica_name": DEFAULT_NAME}
        ledger = Ledger(ledger_db.new_engine())
        twin = RuleAgreement(ledger, ServerSettings(**base))
        await twin.start()
        await twin.stop()
        with pytest.raises(RuleDisagreement, match="a request fee of 5000"):
            await RuleAgreement(ledger, ServerSettings(**base, request_fee_micros=5_000)).start()
        ledger.close()

        # The first serves on, at its own rule.
        key = first.create_user("ann")
        with first.client(key) as client:
            reply = client.post("/generate", json={"rid": "r", "text": "hi", "bid": "0.01"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["meta_info"]["auction"]["request_fee_micros"] == 0
        audit_money_against_answers(first.ledger, {"ann/r": "served"})
