"""Connections: who each client is, and uvicorn's protocol with deadlines and a fair cap.

Who a request is from, for the per-client shares of the connection cap (below).

Behind SMG or a load balancer every connection comes from the proxy's address, so the address
that counts is the one the proxy forwards, in the header it writes (`trusted_proxy_header`:
`X-Forwarded-For`, or RFC 7239 `Forwarded: for=`), believed only when the connection's peer is
a trusted proxy (`trusted_proxies`: addresses or networks). The other header is never read: a
proxy that does not write it passes on whatever the client put there. Each proxy appends the
address it received the request from, so the list is read from the right and the first hop
that is not a trusted proxy is the client; whatever a client wrote further left is its own
claim and ignored. The API key is a second identity: one key counts as one client whatever
addresses it comes from, read from the `Authorization` header as authentication reads it
(`api.bearer`), so that `Bearer K` and `bearer  K` are one key. It is kept as a digest only,
so no key stays in memory in the clear.

uvicorn's HTTP/1.1 protocol with a read deadline and a cap on open connections.

uvicorn waits as long as a client likes for a request's headers and body: 300 sockets that
each send a byte now and then hold 300 connections (and their memory) indefinitely. Here a
request must arrive whole within `read_timeout` seconds of its first byte (or of the
connection opening); a connection that is too slow is answered 408 if its headers never
completed, and closed. Above `max_connections` open connections, a new one is answered 503
and closed at once, before it can cost anything.

The read deadline covers reading only: once the body is in, the request may take as long as
the engine needs, and a keep-alive connection idle between requests is uvicorn's to close.
The cap is shared: one client address (other than a trusted proxy's, `trusted_proxies`) may
hold at most `client_share` of it, and at the cap a new connection takes the place of an idle
one (no request being served: half-open, trickling its headers, or idle between requests) of
the address holding the most, before it is refused: a client holding idle sockets cannot keep
others out. Once a request's headers are in, its client is known better
(above): the address a trusted proxy forwards, and the API key. Neither may
have more than the same share of the cap in requests being served at once; a request past it is
answered 503 (with
`Retry-After`) before it reaches the application. So behind SMG or a load balancer each real
client holds only its share, and one key spread over many addresses cannot hold the cap.

A write deadline covers the answer: a connection whose client has not taken any of what is
waiting to be sent (the transport's buffer stays full) for `write_timeout` seconds is
dropped, so a stream nobody reads cannot hold its connection (and its request at the engine)
for good; its request then counts as left by its client (`server.serving.dispatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import uvicorn
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from inference_auctions.server.api.bearer import bearer_key
from inference_auctions.server.settings import ServerSettings

__all__ = [
    "DISCONNECT_NOTICE",
    "DisconnectNotice",
    "TrustedProxies",
    "disconnect_notice",
    "guarded_protocol",
    "key_digest",
    "uvicorn_config",
]

log = logging.getLogger(__name__)

Headers = Iterable[tuple[bytes, bytes]]
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """The proxies whose forwarding header (`header`: `x-forwarded-for` or `forwarded`) is
    believed: addresses (`10.0.0.5`) and networks (`10.0.0.0/24`); anything else is compared as
    written (a Unix socket's name)."""

    def __init__(self, entries: Iterable[str], header: str = "x-forwarded-for") -> None:
        if header not in _HEADER_READERS:
            raise ValueError(f"trusted_proxy_header must be one of {sorted(_HEADER_READERS)}")
        self._read_hops = _HEADER_READERS[header]
        self._addresses: set[_Address] = set()
        self._networks: list[_Network] = []
        self._literals: set[str] = set()
        for entry in entries:
            try:
                if "/" in entry:
                    self._networks.append(ipaddress.ip_network(entry, strict=False))
                else:
                    self._addresses.add(ipaddress.ip_address(entry))
            except ValueError:
                self._literals.add(entry)

    def __bool__(self) -> bool:
        return bool(self._addresses or self._networks or self._literals)

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str) or not host:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self._literals
        return address in self._addresses or any(address in n for n in self._networks)

    def client_address(self, peer: str | None, headers: Headers) -> str | None:
        """The request's client: `peer` itself unless it is a trusted proxy; then the right-most
        forwarded hop that is not one (the left-most when all are), or `peer` without a header."""
        if peer not in self:
            return peer
        hops = self._read_hops(headers)
        for hop in reversed(hops):
            if hop not in self:
                return hop
        return hops[0] if hops else peer


# What a header that is no bearer key counts as: such requests are refused (401) at once, and
# one share for all of them keeps made-up headers from adding shares.
_NOT_A_KEY = b""


def key_digest(headers: Headers) -> bytes | None:
    """A digest of the API key the request's `Authorization` header carries, read as
    authentication reads it; None without the header."""
    for name, value in headers:
        if name == b"authorization" and value:
            # Latin-1, as the application decodes headers, so both strip the same spaces.
            key = bearer_key(value.decode("latin-1"))
            raw = _NOT_A_KEY if key is None else key.encode("latin-1")
            return hashlib.blake2b(raw, digest_size=16).digest()
    return None


def _x_forwarded_for_hops(headers: Headers) -> list[str]:
    """The addresses `X-Forwarded-For` lists, oldest first."""
    xff = [value for name, value in headers if name == b"x-forwarded-for"]
    text = b",".join(xff).decode("latin-1")
    return [_hop_host(part) for part in text.split(",") if part.strip()]


def _forwarded_for_hops(headers: Headers) -> list[str]:
    """The addresses of RFC 7239 `Forwarded: for=`, oldest first."""
    forwarded = [value for name, value in headers if name == b"forwarded"]
    hops = []
    for element in b",".join(forwarded).decode("latin-1").split(","):
        for pair in element.split(";"):
            name, _, value = pair.strip().partition("=")
            if name.strip().lower() == "for" and value.strip():
                hops.append(_hop_host(value.strip().strip('"')))
    return hops


_HEADER_READERS = {"x-forwarded-for": _x_forwarded_for_hops, "forwarded": _forwarded_for_hops}


def _hop_host(hop: str) -> str:
    """An address without its port, in the form `ipaddress` writes it (`[::1]:80` -> `::1`);
    anything that is not an address (`unknown`, `_hidden`) as written."""
    hop = hop.strip()
    if hop.startswith("["):
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:
        hop = hop.partition(":")[0]
    try:
        return str(ipaddress.ip_address(hop))
    except ValueError:
        return hop


def _host(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


def _plain_response(status: str, text: str, *headers: str) -> bytes:
    body = text.encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", *headers]
    head += [f"content-length: {len(body)}", "connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


_TIMEOUT_RESPONSE = _plain_response("408 Request Timeout", "the request was not sent in time\n")
_BUSY_RESPONSE = _plain_response(
    "503 Service Unavailable", "too many open connections; retry shortly\n", "retry-after: 1"
)
# A refused connection is logged at most this often, so that a flood makes one line a minute.
_REFUSAL_LOG_SECONDS = 60.0


# The ASGI scope extension under which the guarded protocol hands each request its
# `DisconnectNotice` (as `{"notice": ...}`: ASGI extensions are dicts).
DISCONNECT_NOTICE = "inference_auctions.disconnect"


class DisconnectNotice:
    """Callbacks run when the connection of the request being served is lost.

    A handler that waits for something else (its batch, its answer) learns that its client
    left from these, called by the protocol's `connection_lost`, instead of from a task of its
    own reading `receive()` until `http.disconnect`.
    """

    __slots__ = ("_callbacks", "lost")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.lost = False

    def add(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the connection is lost (at once if it already is)."""
        if self.lost:
            callback()
        else:
            self._callbacks.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        """No longer call `callback`."""
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def connection_lost(self) -> None:
        """The connection is gone: call every callback, once."""
        self.lost = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def disconnect_notice(scope: Mapping[str, Any]) -> DisconnectNotice | None:
    """The request's `DisconnectNotice`, when it is served by the guarded protocol."""
    extensions = scope.get("extensions")
    extension = extensions.get(DISCONNECT_NOTICE) if isinstance(extensions, dict) else None
    notice = extension.get("notice") if isinstance(extension, dict) else None
    return notice if isinstance(notice, DisconnectNotice) else None


class _Guarded(HttpToolsProtocol):
    """The deadline and the cap on top of uvicorn's httptools protocol."""

    read_timeout = 30.0
    write_timeout = 30.0
    max_connections = 2_048
    client_share = 0.25
    trusted_proxies = TrustedProxies(())
    _last_refusal_logged = -_REFUSAL_LOG_SECONDS
    _last_share_logged = -_REFUSAL_LOG_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._headers_done = False
        # Who the request being served is from (the forwarded address, the key's digest).
        self._client_address: str | None = None
        self._key: bytes | None = None
        self._notice: DisconnectNotice | None = None  # the request being served's

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        host = _host(transport)
        if host not in self.trusted_proxies:
            own = sum(1 for c in self.connections if isinstance(c, _Guarded) and c._host == host)
            if own >= self._share():
                self._refuse(transport, f"{host} holds its share of the connections")
                return
        if len(self.connections) >= self.max_connections and not self._drop_an_idle_one():
            self._refuse(transport)
            return
        self._host = host
        super().connection_made(transport)
        self._arm()

    _host: str | None = None

    def _share(self) -> int:
        return max(1, int(self.max_connections * self.client_share))

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """Start serving a request, or answer 503 if its client already holds its share."""
        headers = cycle.scope["headers"]
        self._client_address = self.trusted_proxies.client_address(self._host, headers)
        if self._client_address != self._host and self._client_address is not None:
            # The application sees the client the shares count (its port is the proxy's own).
            cycle.scope["client"] = (self._client_address, 0)
        self._key = key_digest(headers)
        self._notice = DisconnectNotice()
        extensions = cycle.scope.get("extensions") or {}
        cycle.scope["extensions"] = {**extensions, DISCONNECT_NOTICE: {"notice": self._notice}}
        over = self._over_share()
        if over is not None:
            app = self._refusal(over)
        super()._start_asgi_task(cycle, app)

    def _over_share(self) -> str | None:
        """What holds its share of the requests being served (this one aside), if anything."""
        forwarded = self._client_address != self._host
        address = self._client_address if forwarded else None
        if address in self.trusted_proxies:
            address = None  # the proxy's own requests (its health checks)
        if address is None and self._key is None:
            return None
        by_address = by_key = 0
        for other in self.connections:
            if other is self or not isinstance(other, _Guarded) or not other._serving():
                continue
            by_address += address is not None and other._client_address == address
            by_key += self._key is not None and other._key == self._key
        if by_address >= self._share():
            return f"the client {address}"
        if by_key >= self._share():
            return "one API key"
        return None

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refusal(self, holder: str) -> ASGI3Application:
        """An application that answers 503: a proxy's connection is kept for its other
        clients, a client's own is closed (it holds too many already)."""
        now = time.monotonic()
        cls = type(self)
        if now - cls._last_share_logged >= _REFUSAL_LOG_SECONDS:
            cls._last_share_logged = now
            log.warning(
                "%s holds its share of the connections (connection_share_per_client): "
                "refusing its new requests",
                holder,
            )
        body = f"{holder} holds its share of the server's connections; retry shortly\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
        ]
        if self._host not in self.trusted_proxies:
            headers.append((b"connection", b"close"))

        async def refuse(
            scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
        ) -> None:
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return refuse

    def _drop_an_idle_one(self) -> bool:
        """Close an idle connection of the address holding the most; False if none is idle."""
        idle = [
            c
            for c in self.connections
            if isinstance(c, _Guarded) and (c.cycle is None or c.cycle.response_complete)
        ]
        if not idle:
            return False
        held = Counter(c._host for c in self.connections if isinstance(c, _Guarded))
        victim = max(idle, key=lambda c: held[c._host])
        victim.transport.abort()
        self.connections.discard(victim)
        return True

    def _refuse(self, transport: asyncio.Transport, why: str = "") -> None:
        now = time.monotonic()
        cls = type(self)
        if now - cls._last_refusal_logged >= _REFUSAL_LOG_SECONDS:
            cls._last_refusal_logged = now
            log.warning(
                "%d connections are open, the limit (max_connections)%s: refusing new ones",
                len(self.connections),
                f"; {why}" if why else "",
            )
        self.transport = transport
        self.parser = None  # type: ignore[assignment]  # nothing is parsed on this connection
        transport.write(_BUSY_RESPONSE)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        super().connection_lost(exc)
        notice, self._notice = self._notice, None
        if notice is not None and self.cycle is not None and not self.cycle.response_complete:
            notice.connection_lost()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.write_timeout, self._not_read)

    def resume_writing(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        super().resume_writing()

    def _not_read(self) -> None:
        self._write_deadline = None
        if self.transport.is_closing():
            return
        client = "{}:{}".format(*self.client) if self.client else "a client"
        log.info(
            "dropped the connection of %s: it took none of its answer for %g s",
            client,
            self.write_timeout,
        )
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # refused at connection_made: closing already
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_done = False
        self._arm()

    def on_headers_complete(self) -> None:
        self._headers_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.read_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        client = "{}:{}".format(*self.client) if self.client else "a client"
        stage = "body" if self._headers_done else "headers"
        log.info(
            "closed the connection of %s: its request %s did not arrive within %g s",
            client,
            stage,
            self.read_timeout,
        )
        if not self._headers_done:
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


# uvicorn's private parts the guard builds on, with the parameters it calls them with. They
# may change in any uvicorn release, so pyproject.toml bounds uvicorn to the versions the
# guard is tested on, and `check_uvicorn_hooks` names the first that changed.
UVICORN_HOOKS: dict[str, tuple[str, ...]] = {
    "_start_asgi_task": ("self", "cycle", "app"),
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "data_received": ("self", "data"),
    "on_message_begin": ("self",),
    "on_headers_complete": ("self",),
    "on_message_complete": ("self",),
    "pause_writing": ("self",),
    "resume_writing": ("self",),
}


def check_uvicorn_hooks(protocol: type = HttpToolsProtocol) -> None:
    """A `RuntimeError` naming the first private hook of uvicorn's `HttpToolsProtocol` that
    is gone or takes other parameters than the guard passes."""
    for name, parameters in UVICORN_HOOKS.items():
        method = getattr(protocol, name, None)
        found = tuple(inspect.signature(method).parameters) if callable(method) else None
        if found != parameters:
            version = getattr(uvicorn, "__version__", "?")
            raise RuntimeError(
                f"uvicorn {version} changed the private hook HttpToolsProtocol.{name} that the "
                f"connection guard (server.api.connections) overrides: expected parameters "
                f"{parameters}, found {found if found is not None else 'no such method'}; "
                "install the uvicorn version pyproject.toml allows"
            )


def guarded_protocol(
    read_timeout: float,
    max_connections: int,
    write_timeout: float = 30.0,
    client_share: float = 0.25,
    trusted_proxies: TrustedProxies | None = None,
) -> type[asyncio.Protocol]:
    """The HTTP protocol class for uvicorn, with these deadlines, this cap and its shares."""
    check_uvicorn_hooks()
    attributes = {
        "read_timeout": read_timeout,
        "max_connections": max_connections,
        "write_timeout": write_timeout,
        "client_share": client_share,
        "trusted_proxies": trusted_proxies or TrustedProxies(()),
    }
    return type("GuardedHttpProtocol", (_Guarded,), attributes)


def uvicorn_config(app: Any, settings: ServerSettings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for the auction server `app`, with the guarded protocol."""
    protocol = guarded_protocol(
        settings.http_read_timeout_seconds,
        settings.max_connections,
        settings.http_write_timeout_seconds,
        settings.connection_share_per_client,
        TrustedProxies(settings.trusted_proxies, settings.trusted_proxy_header),
    )
    # The protocol tells the application the client the shares count; uvicorn's own reading
    # would believe `X-Forwarded-For` from 127.0.0.1 whatever `trusted_proxies` says, and
    # whichever header the proxy writes.
    options.setdefault("proxy_headers", False)
    return uvicorn.Config(app, http=protocol, **options)
