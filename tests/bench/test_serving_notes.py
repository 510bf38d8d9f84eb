"""`bench.serving`'s notes: the figures under each table, read from the rows the right way."""

from __future__ import annotations

from bench.serving import Report, Row, _notes
from bench.serving_wrk import WrkResult


def _row(path: str, connections: int, front: float | None, emulator: float) -> Row:
    result = WrkResult(1000, 1.0, {200: 1000}, 0, 5.0, 8.0, 10.0)
    return Row(path, connections, result, front_cpu_ms=front, emulator_cpu_ms=emulator)


def test_the_server_cpu_is_set_against_the_emulator_of_its_own_round() -> None:
    report = Report("sqlite")
    # Two rounds on a machine that slowed down in between: the emulator's direct requests
    # cost twice as much in the second, and so does the server's.
    report.rows += [
        _row("direct", 20, None, 0.5),
        _row("auction", 20, 1.5, 0.9),
        _row("direct", 20, None, 1.0),
        _row("auction", 20, 3.0, 1.8),
        _row("direct", 200, None, 0.4),
        _row("auction", 200, 0.6, 0.7),
    ]
    [note] = [n for n in _notes(report) if n.startswith("Front CPU per request")]
    # Each auction run over the direct run of its round (not over the auction path's own
    # emulator figure, nor another round's): 3.0x both times, and 1.5x at 200 connections.
    assert note.endswith("20 connections 3.00 (3.00 to 3.00)x; 200 connections 1.50x.")


def test_no_yardstick_without_a_direct_run() -> None:
    report = Report("sqlite")
    report.rows.append(_row("auction", 20, 1.5, 0.9))
    assert not [n for n in _notes(report) if n.startswith("Front CPU per request")]
