"""Import names: only the project's namespace, and the SDK without the server's libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("server", "billing", "sdk", "migrations", "experiments")
BARE = {"server", "billing", "sdk", "migrations", "experiments", "bench", "tests"}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_product_code_imports_only_namespaced_names_and_never_bench() -> None:
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            for name in _imports(path):
                assert name.split(".")[0] not in BARE, f"{path}: import {name}"
                assert not name.startswith("inference_auctions.bench"), path


def test_importing_the_sdk_loads_neither_fastapi_sqlalchemy_nor_numpy() -> None:
    probe = (
        "import sys, inference_auctions.sdk;"
        "heavy = ('fastapi', 'sqlalchemy', 'numpy', 'uvicorn');"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]"
