"""`inference-auction experiment`: quick runs write plots, JSON and markdown; bad input fails."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from inference_auctions.server.cli import main
from inference_auctions.server.cli.experiment_command import experiment

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_command_is_registered() -> None:
    result = CliRunner().invoke(main, ["experiment", "--help"])
    assert result.exit_code == 0, result.output
    assert "figure1|figure2|figure3|figure4|all" in result.output


def test_quick_run_writes_every_figure_and_the_numbers(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(experiment, ["all", "--quick", "--trials", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for figure in ("figure1", "figure2", "figure3", "figure4"):
        assert (out / f"{figure}.png").read_bytes().startswith(PNG)
    numbers = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert numbers["settings"]["queue"] == 512
    assert numbers["settings"]["trials"] == 2
    assert numbers["settings"]["output_tokens"] == [8, 120]
    assert numbers["settings"]["deferral"] == {"threshold_tokens": 32, "max_hold_seconds": 60.0}
    stars = numbers["figures"]["figure2"][0]["points"][0]
    assert stars["workload"] == "mixshare-50"
    assert set(stars["orders"]) == {"dfs-bid", "dfs-uniform", "bid-sort", "no-sort"}
    assert len(stars["orders"]["dfs-bid"]["hit_rate"]["trials"]) == 2
    assert len(numbers["figures"]["figure4"]["long"][0]["paced_welfare"]) == 20
    assert {h["figure"] for h in numbers["headlines"]} >= {"1 (left)", "2", "3", "4"}
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "| figure | claim | paper | ours |" in table
    assert "## Figure4: autobidding" in table


def test_a_users_workload_file_is_swept_over_batch_sizes(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    articles = [" ".join(f"word{a}x{k}" for k in range(300)) for a in range(4)]
    lines = [
        json.dumps({"prompt": f"{articles[i % 4]} Question {i}?", "value": f"{1 + i % 7}.5"})
        for i in range(40)
    ] + [json.dumps({"tokens": list(range(i, i + 50))}) for i in range(1000, 1020)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    args = ["figure1", "--workload", str(path), "--trials", "1", "--orders", "dfs-bid,bid-sort"]
    result = CliRunner().invoke(experiment, [*args, "--quick", "--no-deferral", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "figure1.png").read_bytes().startswith(PNG)
    numbers = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert numbers["settings"]["deferral"] is None
    assert "in-step prefix deferral off" in (out / "results.md").read_text(encoding="utf-8")
    (sweep,) = numbers["figures"]["figure1"]
    assert [p["x"] for p in sweep["points"]] == [32, 60]
    assert set(sweep["points"][0]["orders"]) == {"dfs-bid", "bid-sort"}
    assert sweep["points"][1]["shared_percent"]["mean"] > 40


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        experiment, ["figure1", "--orders", "dfs-bid,random", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "--orders" in result.output
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"tokens": [1, 2]}\n', encoding="utf-8")
    result = runner.invoke(
        experiment, ["figure3", "--workload", str(workload), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "figure3 needs the synthetic workloads" in result.output
    assert runner.invoke(experiment, ["figure9"]).exit_code == 2
    for bad in ("120-8", "eight", "-5", "8-", "8-23001"):
        args = ["figure2", "--output-tokens", bad, "--out", str(tmp_path)]
        result = runner.invoke(experiment, args)
        assert result.exit_code == 2, bad
        assert "--output-tokens" in result.output, bad
