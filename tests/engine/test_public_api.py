"""The server engine package exports what it means to; its pure core loads without I/O."""

from __future__ import annotations

import subprocess
import sys

from inference_auctions.server import engine


def test_every_exported_name_resolves() -> None:
    names = engine.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(engine, name) is not None


def test_the_pure_core_imports_no_web_or_network_library() -> None:
    probe = (
        "import sys, inference_auctions.server.emulator.simulator as s, "
        "inference_auctions.server.emulator.radix_cache as r, "
        "inference_auctions.server.emulator.cost_model as c;"
        "print(sorted(m for m in ('fastapi', 'httpx', 'uvicorn', 'asyncio') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
