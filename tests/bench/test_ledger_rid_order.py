"""`bench.ledger_rid_order` runs both orders on a real ledger, a row per order and mark."""

from __future__ import annotations

import re

import pytest

from bench import ledger_rid_order


def test_a_small_run_prints_both_orders_at_every_mark(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the table whole, one line a row
    ledger_rid_order.main(["--holds", "24", "--every", "12", "--backends", "sqlite"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "│ sqlite" in line]
    assert [("random" in row, "ordered" in row) for row in rows] == [
        (True, False),
        (False, True),
    ] * 2
    ratios = [row.split("│")[-2].strip() for row in rows]
    assert all(ratio == "" for ratio in ratios[0::2])
    assert all(re.fullmatch(r"\d+\.\d\dx / \d+\.\d\dx", ratio) for ratio in ratios[1::2])


def test_marks_must_fall_on_whole_groups() -> None:
    with pytest.raises(SystemExit):
        ledger_rid_order.main(["--holds", "24", "--every", "10", "--group", "6"])
