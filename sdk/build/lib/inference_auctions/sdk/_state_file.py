"""Reading and writing the pacing state file, atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ._exceptions import ConfigurationError

__all__ = ["load_state", "save_state"]


def load_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when the file does not exist yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"pacing state file {path} is not valid JSON") from exc
    if not isinstance(state, dict):
        raise ConfigurationError(f"pacing state file {path} does not hold an object")
    return state


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the file in one step, so a crash mid-write never leaves half a state."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(state, handle, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
