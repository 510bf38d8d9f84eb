"""The server's rooms and which may import which (docs/dev/architecture.md).

The serving path (the HTTP edge, the life of a request, the ledger writer and the engine
client) never imports the SGLang emulator; the engine client imports nothing of the serving
path; the emulator reaches the server only through the engine's protocol; the auction is pure.
Imports inside functions and under `TYPE_CHECKING` count as much as any: a room that needs
another one lazily still needs it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER = "inference_auctions.server"

# room -> the rooms of the server it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": ("emulator", "cli"),
    "serving": ("emulator", "api", "cli", "dashboard", "cluster"),
    "ledger_writer": ("emulator", "api", "serving", "cli", "dashboard", "cluster", "engine"),
    "engine": ("emulator", "api", "serving", "ledger_writer", "cli", "dashboard", "cluster"),
    "emulator": ("api", "serving", "ledger_writer", "cli", "dashboard", "cluster", "auction"),
    "auction": (
        "api",
        "serving",
        "ledger_writer",
        "engine",
        "emulator",
        "cli",
        "dashboard",
        "cluster",
    ),
}
ROOMS = sorted({*FORBIDDEN, "cli", "cluster", "dashboard"})


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in `path`, `from a import b` giving a and a.b."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _room(module: str) -> str | None:
    parts = module.split(".")
    if module.startswith(SERVER + ".") and len(parts) >= 3 and parts[2] in ROOMS:
        return parts[2]
    return None


def trespasses(path: Path, room: str) -> list[str]:
    """What `path`, a module of `room`, imports from the rooms it must not."""
    return sorted(
        {
            f"{path.name}:{line} imports {module}"
            for line, module in _imported(path)
            if _room(module) in FORBIDDEN[room]
        }
    )


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_each_room_imports_only_what_it_may(room: str) -> None:
    files = sorted((ROOT / "server" / room).rglob("*.py"))
    assert files, f"server/{room} is empty"
    found = [problem for path in files for problem in trespasses(path, room)]
    assert found == []


def test_the_rule_sees_every_kind_of_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import inference_auctions.server.emulator.simulator\n"
        "from inference_auctions.server.emulator import EmbeddedEngine\n"
        "from inference_auctions.server import emulator\n"
        "from inference_auctions.server.engine.protocol import Engine\n"
        "def later():\n"
        "    from inference_auctions.server.emulator.live import LiveSimulator\n"
    )
    found = trespasses(probe, "serving")
    lines = {problem.split(":")[1].split()[0] for problem in found}
    assert lines == {"1", "2", "3", "6"}, found


def test_the_engine_choice_is_the_only_module_outside_the_rooms_that_reaches_the_emulator() -> None:
    top_level = sorted((ROOT / "server").glob("*.py"))
    reaching = {
        path.name
        for path in top_level
        for _, module in _imported(path)
        if _room(module) == "emulator"
    }
    assert reaching == {"engine_choice.py"}
