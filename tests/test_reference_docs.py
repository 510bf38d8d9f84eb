"""docs/reference/ is generated from the code (tools/reference_docs.py) and kept in step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inference_auctions.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_reference_matches_the_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.reference_docs", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_setting_is_documented_where_it_is_declared() -> None:
    undocumented = [n for n, f in ServerSettings.model_fields.items() if not f.description]
    assert not undocumented, f"give these settings a docstring under the field: {undocumented}"
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    for name in ServerSettings.model_fields:
        assert f"`INFERENCE_AUCTION_{name.upper()}`" in page


def test_the_check_notices_a_stale_page(tmp_path: Path) -> None:
    from tools import reference_docs

    page = reference_docs.REFERENCE / "metrics.md"
    original = page.read_text()
    try:
        page.write_text(original.replace("Batches cleared", "Batches cleard"))
        assert reference_docs.main(["--check"]) == 1
    finally:
        page.write_text(original)
    assert reference_docs.main(["--check"]) == 0
