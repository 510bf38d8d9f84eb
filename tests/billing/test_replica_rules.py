"""Replicas on one ledger clear under one rule: a row per server process, whatever the names."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from inference_auctions.billing import Ledger, RuleDisagreement
from inference_auctions.billing.models import ReplicaRule
from inference_auctions.billing.replica_rules import ReplicaProcess, Rule
from tests.billing.conftest import Clock
from tests.db_fixtures import MigratedDatabase

LIVE = timedelta(seconds=30)
FEE = 20_000
# The default name of every host started with `serve --host 0.0.0.0`.
DEFAULT_NAME = "0.0.0.0:8000"


def _rule(fee: int) -> Rule:
    return ("fixed-slots", 64, fee, None)


def _process(id_: str, clock: Clock, name: str = DEFAULT_NAME, pid: int = 100) -> ReplicaProcess:
    return ReplicaProcess(id=id_, replica=name, host=f"host-{id_}", pid=pid, started_at=clock())


def _rows(db: MigratedDatabase) -> dict[str, int]:
    """The processes' ids and their request fees, as the table holds them."""
    with db.engine.connect() as connection:
        rows = connection.execute(select(ReplicaRule.process, ReplicaRule.request_fee_micros))
        return {str(process): int(fee) for process, fee in rows}


def test_replicas_of_other_names_must_clear_under_one_rule(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.join_replicas(_process("a", clock, "r0"), _rule(FEE), LIVE)
    ledger.join_replicas(_process("b", clock, "r1"), _rule(FEE), LIVE)  # the same rule: welcome
    with pytest.raises(RuleDisagreement, match=r"'r0'.*request fee of 20000.*request fee of 0"):
        ledger.join_replicas(_process("c", clock, "r2"), _rule(0), LIVE)
    clock.advance(seconds=25)
    ledger.replica_heartbeat(_process("b", clock, "r1"), _rule(FEE), LIVE)
    clock.advance(seconds=10)  # r0 went silent (crashed); r1 is still live
    with pytest.raises(RuleDisagreement, match="'r1'"):
        ledger.join_replicas(_process("c", clock, "r2"), _rule(0), LIVE)
    ledger.leave_replicas(_process("b", clock, "r1"))  # stopped cleanly: the rule may change
    ledger.join_replicas(_process("c", clock, "r2"), _rule(0), LIVE)
    assert _rows(ledger_db) == {"c": 0}, "r0's lapsed row is gone with the start that saw it"


def test_two_processes_of_one_name_are_two_replicas(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    # Before: rows were keyed by the name, and a process compared only other names' rows. Two
    # hosts both called 0.0.0.0:8000 ran with fees 0 and 1,000 (the second overwrote the
    # first's row); when one stopped it deleted the shared row, and a third with 5,000
    # started beside the other.
    ledger = Ledger(ledger_db.engine, clock=clock)
    first, twin = _process("a", clock), _process("b", clock)
    ledger.join_replicas(first, _rule(0), LIVE)
    with pytest.raises(RuleDisagreement, match=r"'0\.0\.0\.0:8000'.*fee of 0 .*fee of 1000 "):
        ledger.join_replicas(twin, _rule(1_000), LIVE)
    assert _rows(ledger_db) == {"a": 0}
    ledger.join_replicas(twin, _rule(0), LIVE)  # the same rule beside it: welcome
    ledger.leave_replicas(twin)
    assert _rows(ledger_db) == {"a": 0}, "the twin's stop left the other's row"
    with pytest.raises(RuleDisagreement, match="process 100 on host-a"):
        ledger.join_replicas(_process("c", clock), _rule(5_000), LIVE)


def test_a_restart_after_a_crash_is_told_when_the_dead_row_lapses(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    # Before: a restart under another rule was refused for up to 30 s with "stop every
    # replica", although the other was dead and nothing could be stopped.
    ledger = Ledger(ledger_db.engine, clock=clock)
    ledger.join_replicas(_process("a", clock, pid=41), _rule(0), LIVE)  # then killed
    clock.advance(seconds=12)
    with pytest.raises(RuleDisagreement) as refused:
        ledger.join_replicas(_process("b", clock, pid=42), _rule(1_000), LIVE)
    message = str(refused.value)
    assert "process 41 on host-a, last seen 12 s ago" in message
    assert "if it is not running any more (it crashed)" in message
    assert "allowed from 12:00:30 UTC, in 18 s" in message
    assert refused.value.allowed_at == clock() + timedelta(seconds=18)
    clock.advance(seconds=17)
    with pytest.raises(RuleDisagreement, match="in 1 s"):
        ledger.join_replicas(_process("b", clock, pid=42), _rule(1_000), LIVE)
    clock.advance(seconds=1)
    ledger.join_replicas(_process("b", clock, pid=42), _rule(1_000), LIVE)
    assert _rows(ledger_db) == {"b": 1_000}


def test_a_heartbeat_after_its_row_lapsed_rejoins_only_under_the_same_rule(
    ledger_db: MigratedDatabase, clock: Clock
) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    cut_off, other = _process("a", clock), _process("b", clock, "elsewhere")
    ledger.join_replicas(cut_off, _rule(0), LIVE)
    clock.advance(seconds=31)  # it could not write for longer than the window
    ledger.join_replicas(other, _rule(1_000), LIVE)  # took its row for a stopped process's
    with pytest.raises(RuleDisagreement, match="'elsewhere'"):
        ledger.replica_heartbeat(cut_off, _rule(0), LIVE)
    assert _rows(ledger_db) == {"b": 1_000}
    ledger.leave_replicas(other)
    ledger.replica_heartbeat(cut_off, _rule(0), LIVE)
    assert _rows(ledger_db) == {"a": 0}


def test_the_start_time_is_kept(ledger_db: MigratedDatabase, clock: Clock) -> None:
    ledger = Ledger(ledger_db.engine, clock=clock)
    started: datetime = clock()
    ledger.join_replicas(_process("a", clock), _rule(0), LIVE)
    clock.advance(seconds=5)
    ledger.replica_heartbeat(_process("a", clock), _rule(0), LIVE)
    with ledger_db.engine.connect() as connection:
        times = connection.execute(select(ReplicaRule.started_at, ReplicaRule.seen_at)).one()
    assert tuple(times) == (started, clock())
