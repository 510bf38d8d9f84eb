"""The dashboard's number formatting and axis scales, run in Node (the browser's engine for
ES modules without a page): an empty chart has no 1e-15 scale, and a 0.25 gridline reads 0.25.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

STATIC = Path(__file__).parents[2] / "server" / "dashboard" / "static"

# charts.js and format.js are ES modules that touch the DOM only when they draw.
SCRIPT = """
import { niceTicks } from "./charts.js";
import { credits, creditsShort, decimal } from "./format.js";
const out = {
  emptyTicks: niceTicks(0, 0),
  quarterTicks: niceTicks(0, 1).map(decimal),
  rateTicks: niceTicks(0, 0.9).map(decimal),
  creditTicks: niceTicks(0, 1_000_000).map(creditsShort),
  smallCredits: [125_000, 2_500, 12_345_678].map(creditsShort),
  exact: credits(316_666),
};
console.log(JSON.stringify(out));
"""


def _node() -> str:
    # The same probe runs in Chromium in test_dashboard_browser.py, which CI requires.
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the browser tests run the same probe in Chromium)")
    return node


def check_probe(out: dict[str, object]) -> None:
    """What the probe (SCRIPT) must print, whichever engine ran it."""
    assert out["emptyTicks"] == [0]  # nothing to scale: a 0 line, not 2.5e-16 ... 1e-15
    assert out["quarterTicks"] == ["0", "0.25", "0.5", "0.75", "1"]
    assert "0.3" not in out["rateTicks"] and "0.25" in out["rateTicks"]
    assert out["creditTicks"] == ["0", "0.25", "0.5", "0.75", "1"]
    assert out["smallCredits"] == ["0.125", "0.0025", "12.35"]
    assert out["exact"] == "0.316666"


def test_axes_label_what_they_show(tmp_path: Path) -> None:
    for name in ("charts.js", "format.js"):
        (tmp_path / name).write_text((STATIC / name).read_text())
    (tmp_path / "probe.mjs").write_text(SCRIPT)
    result = subprocess.run(
        [_node(), "probe.mjs"], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=9
    )
    assert result.returncode == 0, result.stderr
    check_probe(json.loads(result.stdout))
