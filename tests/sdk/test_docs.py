"""Every `python` block of docs/SDK.md runs as written, in order, against a real server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
    assert any("openai.OpenAI(" in block for block in blocks)
    assert any("client.chat.completions.create(" in block for block in blocks)
    # The async client's stream: `async for`, and a `get_final()` that must be awaited.
    assert any("async for" in block and "await stream.get_final()" in block for block in blocks)


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
    # OpenAI's own client got an answer with the auction, and an error with OpenAI's code.
    assert re.search(r"^openai: .* \d+$", out, re.MULTILINE), out
    assert "openai error code: invalid_api_key" in out
    assert "bid 0" in out  # chat.completions.create without a value bids 0


def test_the_first_example_works_for_the_user_the_readme_creates(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    found = re.search(r"users create alice --budget (\d+) --period (\w+)", readme)
    assert found is not None, "the README no longer creates alice with a budget period"
    _, key = live.new_user(budget_micros=int(found[1]) * 1_000_000, period=found[2])
    monkeypatch.setenv("INFERENCE_AUCTION_BASE_URL", live.url)
    monkeypatch.setenv("INFERENCE_AUCTION_API_KEY", key)
    namespace: dict[str, Any] = {"__name__": "docs_sdk"}
    exec(compile(python_blocks()[0], "docs/SDK.md block 1", "exec"), namespace)
    namespace["client"].close()
