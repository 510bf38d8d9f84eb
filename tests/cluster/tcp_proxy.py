"""A TCP proxy in front of the test database, so a test can cut the database off and back on
without stopping the machine's PostgreSQL server, which other tests share."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.processes import free_port


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `upstream` until `cut()`; `restore()` listens again."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.port = free_port()
        self._upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        """Accept connections again (the database is back)."""
        listener = socket.create_server(("127.0.0.1", self.port))
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop every open one (the database is gone)."""
        with self._lock:
            doomed = [*self._sockets, *([self._listener] if self._listener else [])]
            self._sockets.clear()
            self._listener = None
        for sock in doomed:
            _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _close(client)
                    _close(upstream)
                    return
                self._sockets |= {client, upstream}
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(target)


def _close(sock: socket.socket) -> None:
    # shutdown() first: it wakes a thread blocked in accept() or recv() on the socket.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
