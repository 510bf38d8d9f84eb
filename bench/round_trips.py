"""A TCP relay in front of PostgreSQL that counts round trips. What a statement costs on a
busy server is mostly that wait, so tests count it rather than time it.

A client waits for the server at every sync point of the protocol: after each statement sent
on its own, after each pipeline as a whole. The server ends each with one ReadyForQuery
message, so the relay counts those in what the server sends (the connection is unencrypted,
so that it can read them).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from sqlalchemy.engine import make_url

_READY_FOR_QUERY = ord("Z")


class RoundTrips:
    """Relays every connection made to `url` to the server of the URL it was made for."""

    def __init__(self, server_url: str) -> None:
        real = make_url(server_url)
        self._target = (real.host or "127.0.0.1", real.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        relayed = real.set(host="127.0.0.1", port=port).update_query_dict(
            {"sslmode": "disable", "gssencmode": "disable"}
        )
        self.url = relayed.render_as_string(hide_password=False)
        self._lock = threading.Lock()
        self._count = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def count(self) -> int:
        """Round trips so far, over every connection."""
        with self._lock:
            return self._count

    @contextmanager
    def counting(self) -> Iterator[list[int]]:
        """The round trips made inside the block, in a one-item list filled at its end."""
        before = self.count
        taken: list[int] = []
        yield taken
        taken.append(self.count - before)

    def close(self) -> None:
        """Stop accepting connections (those open end with their clients)."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _shut(source, sink)

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        """Relay the server's messages (type byte, 4-byte length), counting ReadyForQuery."""
        pending = b""
        try:
            while data := server.recv(65536):
                pending += data
                while len(pending) >= 5:
                    end = 1 + int.from_bytes(pending[1:5], "big")
                    if len(pending) < end:
                        break
                    if pending[0] == _READY_FOR_QUERY:
                        with self._lock:
                            self._count += 1
                    pending = pending[end:]
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server, client)


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
