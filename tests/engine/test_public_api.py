"""`server.engine` exports what it means to, and its pure core loads without I/O libraries."""

from __future__ import annotations

import subprocess
import sys

import server.engine


def test_every_exported_name_resolves() -> None:
    names = server.engine.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(server.engine, name) is not None


def test_the_pure_core_imports_no_web_or_network_library() -> None:
    probe = (
        "import sys, server.engine.simulator, server.engine.radix_cache, server.engine.cost_model;"
        "print(sorted(m for m in ('fastapi', 'httpx', 'uvicorn', 'asyncio') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
