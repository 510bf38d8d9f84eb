"""The ledger writer's own process: group commits outside the server's interpreter.

A server's ledger thread shares the interpreter's lock with the event loop. The `sqlite3` and
psycopg drivers let go of that lock around every statement, and take it back only when the
loop lets go of it too, so beside a busy loop a group commit costs about 1.7 times the CPU it
costs alone, and takes about 2.5 times as long (`bench.ledger_lone_request --beside half`).
Here the commits run in a process of their own, on its own interpreter, and the server talks
to it over a pair of connected Unix sockets (`server.ledger_lanes.ProcessLane`).

The protocol is one request at a time in each direction, answered in order:

* frames are a 4-byte big-endian length, then a pickle;
* the server's first frame configures the process (`WriterConfig`), which answers `READY`
  once its ledger is open, or the error that kept it from opening;
* then each request is `("group", (holds, served, claims))` for `Ledger.commit_group`, or
  `("call", (method, args, kwargs))` for another method of the ledger; each answer is
  `(True, result)` or `(False, error)`.

The process leaves when the server closes its end, after the request in progress: it ignores
SIGINT and SIGTERM, which a terminal or a supervisor sends to the server's whole process
group, so that a draining server's last commits still have their writer. A server that dies
(SIGKILL, a crash) takes the process with it, at once, on Linux (`PR_SET_PDEATHSIG`): its
transaction in progress is then rolled back by the database, as the server's own would have
been, and crash recovery finds what it finds after any crash (docs/OPERATIONS.md). Elsewhere
the process leaves once the server's end is closed, after its commit in progress.

Run by `ProcessLane` as `python -m inference_auctions.server.ledger_process FD SERVER_PID`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import pickle
import signal
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Any

from inference_auctions.billing import Ledger, LedgerUnavailable

__all__ = ["READY", "WriterConfig", "decode", "encode", "main"]

log = logging.getLogger(__name__)

READY = "ready"
_HEADER = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """What the writer process opens: the server's ledger, as the server opens it."""

    url: str
    sqlite_busy_timeout_seconds: float  # as the server waits for SQLite's lock
    checkpoint_in_background: bool  # the WAL checkpoints of a SQLite file run here


def encode(message: object) -> bytes:
    """One frame: the length, then the pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Any:
    """The message of one frame's payload."""
    return pickle.loads(payload)


def header_length(header: bytes) -> int:
    """The payload length a frame's header announces."""
    (length,) = _HEADER.unpack(header)
    return int(length)


HEADER_BYTES = _HEADER.size


def _read_exactly(channel: socket.socket, count: int) -> bytes | None:
    """`count` bytes, or None if the server closed its end first."""
    chunks = bytearray()
    while len(chunks) < count:
        chunk = channel.recv(count - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _receive(channel: socket.socket) -> Any | None:
    header = _read_exactly(channel, HEADER_BYTES)
    if header is None:
        return None
    payload = _read_exactly(channel, header_length(header))
    return None if payload is None else decode(payload)


def _answer(channel: socket.socket, ok: bool, value: object) -> None:
    try:
        frame = encode((ok, value))
    except Exception as error:  # a result or an error that does not pickle: say so instead
        log.exception("the ledger writer cannot send its answer back")
        frame = encode((False, LedgerUnavailable(f"the ledger writer's answer was lost: {error}")))
    channel.sendall(frame)


def _run(ledger: Ledger, kind: str, payload: Any) -> Any:
    if kind == "group":
        holds, served, claims = payload
        return ledger.commit_group(holds, served, claims)
    if kind == "call":
        method, args, kwargs = payload
        return getattr(ledger, method)(*args, **kwargs)
    raise ValueError(f"unknown request {kind!r}")


def serve(channel: socket.socket) -> None:
    """Open the configured ledger, then answer requests until the server closes its end."""
    config = _receive(channel)
    if not isinstance(config, WriterConfig):
        return
    # What the claims' clearing needs (the auction, numpy) is imported now, before the server
    # is told this process is ready: unpickled on the first claim, it took about 0.2 s there.
    importlib.import_module("inference_auctions.server.clearing")
    try:
        ledger = Ledger.from_url(
            config.url,
            checkpoint_in_background=config.checkpoint_in_background,
            sqlite_busy_timeout=config.sqlite_busy_timeout_seconds,
        )
    except Exception as error:
        _answer(channel, False, LedgerUnavailable(f"the ledger writer cannot open it: {error}"))
        return
    try:
        _answer(channel, True, READY)
        while (request := _receive(channel)) is not None:
            kind, payload = request
            try:
                result = _run(ledger, kind, payload)
            except Exception as error:
                _answer(channel, False, error)
            else:
                _answer(channel, True, result)
    finally:
        ledger.close()


def _die_with(server_pid: int) -> None:
    """Be killed when the server dies (Linux), or leave now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("cannot follow the server's death: errno %d", ctypes.get_errno())
    if os.getppid() != server_pid:  # it died before the line above
        raise SystemExit(1)


_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> None:
    """The process's entry point: the socket's file descriptor and the server's pid."""
    args = sys.argv[1:] if argv is None else argv
    _die_with(int(args[1]))
    # The server decides when this process ends, by closing its end (module docstring).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s ledger-writer: %(message)s")
    # Once the server is gone, nobody is left to answer.
    with (
        socket.socket(fileno=int(args[0])) as channel,
        contextlib.suppress(BrokenPipeError, ConnectionResetError),
    ):
        serve(channel)


if __name__ == "__main__":
    # Under its package name, not as `__main__`: the server's pickles name this module's
    # classes by that name.
    from inference_auctions.server.ledger_process import main as run

    run()
