"""`bench.serving_ab` compares two versions of the server: each must run its own code, and the
comparison must read the runs the right way round."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.serving_ab import (
    ROOT,
    Version,
    _batch_size,
    _paired,
    _parse,
    _python,
    check_imports,
    worktree,
)


def test_a_worktree_version_imports_its_own_code(tmp_path: Path) -> None:
    # `inference_auctions` is a namespace package and this checkout is installed editable:
    # without the worktree first on the path (and as the working directory), the "baseline"
    # would silently run this checkout's code.
    with worktree("HEAD", tmp_path) as root:
        version = Version("baseline", "baseline", root, [])
        check_imports(version)
        where = Path(
            _python(version, "-c", "import inference_auctions.server as s; print(s.__file__)")
        )
        assert where.resolve().is_relative_to(root.resolve())
    assert not root.exists()  # the worktree is removed afterwards


def test_a_ref_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="cannot check out 'no-such-ref'"),
        worktree("no-such-ref", tmp_path),
    ):
        pass


def test_a_version_whose_code_is_not_found_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"imports inference_auctions\.server from"):
        check_imports(Version("baseline", "baseline", tmp_path, []))


def test_this_checkout_imports_itself() -> None:
    check_imports(Version("candidate", "candidate", ROOT, []))


def test_paired_ratios_count_wins_in_the_right_direction() -> None:
    baseline = [100.0, 100.0, 100.0]
    candidate = [110.0, 90.0, 120.0]
    assert _paired(candidate, baseline, higher_is_better=True) == "1.10x, ahead in 2 of 3"
    # For CPU, lower is better: the same numbers are one win, not two.
    assert _paired(candidate, baseline, higher_is_better=False) == "1.10x, ahead in 1 of 3"
    assert _paired([1.0], [0.0], higher_is_better=True) == "-"


def test_batch_size_is_the_mean_from_the_metrics() -> None:
    metrics = "\n".join(
        [
            "# HELP inference_auction_batch_size Requests per batch",
            'inference_auction_batch_size_bucket{le="1.0"} 3.0',
            "inference_auction_batch_size_sum 60.0",
            "inference_auction_batch_size_count 12.0",
        ]
    )
    assert _batch_size(metrics) == 5.0
    assert _batch_size("inference_auction_batch_size_count 0.0") is None


def test_the_command_line_has_every_option_the_run_reads() -> None:
    args = _parse([])
    assert (args.rounds, args.seconds, args.warmup, args.connections) == (3, 8.0, 2.0, [20, 200])
    assert args.baseline == "HEAD" and args.candidate is None and args.database == "sqlite"
    assert args.baseline_python is None and args.candidate_python is None
    with pytest.raises(SystemExit):
        _parse(["--rounds", "0"])
    with pytest.raises(SystemExit):
        _parse(["--candidate-python", "/no/such/python"])
    with pytest.raises(SystemExit):  # a folder is not an interpreter
        _parse(["--baseline-python", str(ROOT)])
    assert Path(_parse(["--candidate-python", "sh"]).candidate_python).is_absolute()


def test_a_version_runs_with_the_interpreter_it_names(tmp_path: Path) -> None:
    # A stand-in interpreter that says who it is, whatever it is asked to run.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho stand-in\n")
    python.chmod(0o755)
    version = Version("candidate", "candidate", ROOT, [], str(python))
    assert _python(version, "-c", "print('real')") == "stand-in"
    assert _python(Version("candidate", "candidate", ROOT, []), "-c", "print('real')") == "real"
