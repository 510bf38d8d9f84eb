"""The Rich console every command prints tables with.

Rich lays tables out for 80 columns when its output is not a terminal, and cuts long values
to fit ("alice-the-…"). A pipe or a file wants every value whole, so there the console is as
wide as the widest table needs (tables take only the width they need).
"""

from __future__ import annotations

from typing import TextIO

from rich.console import Console

__all__ = ["table_console"]

_UNLIMITED_WIDTH = 100_000


def table_console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """A console for tables: the terminal's width, or unlimited when not a terminal."""
    console = Console(file=file, stderr=stderr)
    if console.is_terminal:
        return console
    return Console(file=file, stderr=stderr, width=_UNLIMITED_WIDTH)
