"""Every `python` block of docs/SDK.md runs as written, in order, against a real server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .live_server import LiveServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "SDK.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    """The `python` code blocks of docs/SDK.md, in order."""
    return _BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_the_docs_have_runnable_examples() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 6
    assert any("stream=True" in block and "Auction" in block for block in blocks)


def test_the_docs_snippets_run_against_a_real_server(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, key = live.new_user(budget_micros=50_000_000, period="day")
    monkeypatch.setenv("INFERENCE_AUCTION_BASE_URL", live.url)
    monkeypatch.setenv("INFERENCE_AUCTION_API_KEY", key)
    namespace: dict[str, object] = {"__name__": "docs_sdk"}
    for number, block in enumerate(python_blocks(), start=1):
        try:
            exec(compile(block, f"docs/SDK.md block {number}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/SDK.md python block {number} failed: {exc!r}") from exc
    out = capsys.readouterr().out
    assert "not sent:" in out  # the exhausted-budget example took its documented path
    assert "inference-auction-emulated" in out
