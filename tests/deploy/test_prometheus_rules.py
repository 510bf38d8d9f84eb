"""deploy/prometheus/rules.yml: valid for Prometheus, each alert fired once by its test, and
every series it names one the server exports (or Prometheus' own).

`promtool` is Debian's `prometheus` package; without it the promtool checks are skipped
(or fail, under INFERENCE_AUCTION_REQUIRE_PROMTOOL=1).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_grafana_dashboard import exported_series, series_named
from tests.server.harness import RunningServer

FOLDER = Path(__file__).parents[2] / "deploy" / "prometheus"
# Series of Prometheus itself (`up`) and of the blackbox exporter that probes /health.
_NOT_THE_SERVER_S = {"up", "probe_success"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool not installed (apt-get install prometheus)"
        if os.environ.get("INFERENCE_AUCTION_REQUIRE_PROMTOOL") == "1":
            pytest.fail(message + " (INFERENCE_AUCTION_REQUIRE_PROMTOOL=1)", pytrace=False)
        pytest.skip(message)
    return path


def _rules() -> list[dict[str, str]]:
    groups = yaml.safe_load((FOLDER / "rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", "rules.yml"],
        cwd=FOLDER,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_fires_each_alert_on_its_series() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", "rules.test.yml"],
        cwd=FOLDER,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_it() -> None:
    tests = yaml.safe_load((FOLDER / "rules.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in _rules()}


def test_the_rules_name_series_the_server_exports(server: RunningServer) -> None:
    exported = exported_series(server.url) | _NOT_THE_SERVER_S
    for rule in _rules():
        named = series_named(rule["expr"])
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)
