"""Who a request is from, for the per-client shares of the connection cap
(`server.api.http_protocol`).

Behind SMG or a load balancer every connection comes from the proxy's address, so the address
that counts is the one the proxy forwards: `X-Forwarded-For` (or, without it, RFC 7239
`Forwarded: for=`), believed only when the connection's peer is a trusted proxy
(`trusted_proxies`: addresses or networks). Each proxy appends the address it received the
request from, so the list is read from the right and the first hop that is not a trusted proxy
is the client; whatever a client wrote further left is its own claim and ignored. The API key
(the `Authorization` header) is a second identity: one key counts as one client whatever
addresses it comes from. It is kept as a digest only, so no key stays in memory in the clear.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

__all__ = ["TrustedProxies", "key_digest"]

Headers = Iterable[tuple[bytes, bytes]]
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """The proxies whose forwarding headers are believed: addresses (`10.0.0.5`) and networks
    (`10.0.0.0/24`); anything else is compared as written (a Unix socket's name)."""

    def __init__(self, entries: Iterable[str]) -> None:
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
        hops = _forwarded_hops(headers)
        for hop in reversed(hops):
            if hop not in self:
                return hop
        return hops[0] if hops else peer


def key_digest(headers: Headers) -> bytes | None:
    """A digest of the request's `Authorization` header, None without one."""
    for name, value in headers:
        if name == b"authorization" and value:
            return hashlib.blake2b(value, digest_size=16).digest()
    return None


def _forwarded_hops(headers: Headers) -> list[str]:
    """The forwarded addresses, oldest first: `X-Forwarded-For` if sent, else `Forwarded`."""
    headers = list(headers)
    xff = [value for name, value in headers if name == b"x-forwarded-for"]
    if xff:
        text = b",".join(xff).decode("latin-1")
        return [_host(part) for part in text.split(",") if part.strip()]
    forwarded = [value for name, value in headers if name == b"forwarded"]
    hops = []
    for element in b",".join(forwarded).decode("latin-1").split(","):
        for pair in element.split(";"):
            name, _, value = pair.strip().partition("=")
            if name.strip().lower() == "for" and value.strip():
                hops.append(_host(value.strip().strip('"')))
    return hops


def _host(hop: str) -> str:
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
