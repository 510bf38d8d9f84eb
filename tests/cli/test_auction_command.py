"""`inference-auction auction`: the installed console script on real batch files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "batch.jsonl"


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "inference_auctions.server.cli",
        *args,
    ]
    return subprocess.run(
        command, check=False, input=stdin, capture_output=True, text=True, timeout=60
    )


def test_example_batch_as_json() -> None:
    result = _cli("auction", str(EXAMPLE), "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    order = outcome["order"]
    assert sorted(order) == ["q1", "q2", "q3", "q4", "q5", "q6"]
    # The three article questions share a prefix, so they are served contiguously,
    # and their average bid (0.2667) puts the group after carol's lone 0.30 bid.
    group = [order.index(rid) for rid in ("q1", "q4", "q2")]
    assert group == sorted(group) and group[-1] - group[0] == 2
    assert order.index("q3") < group[0]
    assert outcome["requests"][0]["bid_micros"] == 300_000
    assert set(outcome["payments_micros"]) == {"alice", "bob", "carol", "dave", "erin"}
    assert all(isinstance(v, int) and v >= 0 for v in outcome["payments_micros"].values())
    assert outcome["tree"]["shared_tokens"] > 0


def test_table_output_names_the_payments() -> None:
    result = _cli("auction", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "VCG payments" in result.stdout
    assert "0.400000" in result.stdout  # alice's q1 bid, in credits


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"rid": "a", "user": "u", "tokens": [1], "bid": "-1"}',
            "batch.jsonl:1: bid: must not be negative",
        ),
        ('{"rid": "a", "user": "u", "tokens": [1], "bid": "0.0000001"}', "at most 6 decimal"),
        ('{"rid": "a", "user": "u", "tokens": [1], "bid": NaN}', "bid"),
        (
            '{"rid": "a", "user": "u", "tokens": [1.5], "bid": 1}',
            "batch.jsonl:1: field 'tokens' must be a list of token ids",
        ),
        ('{"rid": "a", "user": "u", "bid": 1}', "exactly one of 'prompt'"),
        ('{"rid": "a", "tokens": [1], "bid": 1}', "field 'user'"),
        ("not json", "batch.jsonl:1: not valid JSON"),
    ],
)
def test_bad_lines_exit_2_naming_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(line + "\n")
    result = _cli("auction", str(batch))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_duplicate_rids_are_refused(tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"rid": "a", "user": "u", "tokens": [1], "bid": 1}\n' * 2)
    result = _cli("auction", str(batch))
    assert result.returncode == 2
    assert "request 'a': rid is a duplicate" in result.stderr


def test_reads_standard_input() -> None:
    result = _cli("auction", "-", "--json", stdin='{"user": "u", "tokens": [1, 2], "bid": 2}\n')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["order"] == ["line-1"]


def test_every_charge_the_server_would_make_fees_included() -> None:
    # The price-dilution example: A [P, X] bids 10, C [Q, X] bids 6, one junk request.
    batch = "\n".join(
        json.dumps(line)
        for line in (
            {"rid": "a", "user": "A", "tokens": [1, 3], "bid": "10"},
            {"rid": "c", "user": "C", "tokens": [2, 3], "bid": "6"},
            {"rid": "junk", "user": "A", "tokens": [7], "bid": "0"},
        )
    )
    fixed = json.loads(
        _cli("auction", "-", "--json", "--slots", "8", "--fee", "0.01", stdin=batch).stdout
    )
    assert fixed["rule"] == {"name": "fixed-slots", "slots": 8, "request_fee_micros": 10_000}
    # 6 credits of delay over 7 slots, whatever the junk; the junk pays its fee.
    assert fixed["payments_micros"] == {"A": 6_000_000 // 7, "C": 0}
    assert fixed["fees_micros"] == {"A": 20_000, "C": 10_000}
    assert fixed["charges_micros"] == {"A": 6_000_000 // 7 + 20_000, "C": 10_000}
    assert fixed["fee_revenue_micros"] == 30_000
    paper = json.loads(_cli("auction", "-", "--json", "--batch-size-slots", stdin=batch).stdout)
    assert paper["rule"]["name"] == "batch-size" and paper["payments_micros"]["A"] == 3_000_000
    table = _cli("auction", "-", "--slots", "8", "--fee", "0.01", stdin=batch)
    assert "+ fees 0.030000" in table.stdout and "charge" in table.stdout
    too_small = _cli("auction", "-", "--slots", "2", stdin=batch)
    assert too_small.returncode == 2 and "more than the rule's 2 priority slots" in too_small.stderr
    bad_fee = _cli("auction", "-", "--fee", "-1", stdin=batch)
    assert bad_fee.returncode == 2 and "--fee" in bad_fee.stderr
