"""The client a request counts as, for the per-client shares of the connection cap."""

from __future__ import annotations

from inference_auctions.server.api.connections import TrustedProxies, key_digest

PROXIES = TrustedProxies(["10.0.0.5", "10.1.0.0/16", "fd00::/8"])


def _xff(value: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode())]


def test_an_untrusted_peer_is_the_client_whatever_it_claims() -> None:
    assert PROXIES.client_address("203.0.113.9", _xff("198.51.100.7")) == "203.0.113.9"


def test_the_right_most_hop_that_is_not_a_trusted_proxy_is_the_client() -> None:
    # The client wrote 1.2.3.4 itself; the load balancer (10.1.2.3) appended what it saw.
    headers = _xff("1.2.3.4, 198.51.100.7, 10.1.2.3")
    assert PROXIES.client_address("10.0.0.5", headers) == "198.51.100.7"
    split = [(b"x-forwarded-for", b"1.2.3.4"), (b"x-forwarded-for", b"198.51.100.7:5123")]
    assert PROXIES.client_address("10.0.0.5", split) == "198.51.100.7"


def test_all_hops_trusted_or_none_sent() -> None:
    assert PROXIES.client_address("10.0.0.5", _xff("10.1.0.1, 10.1.0.2")) == "10.1.0.1"
    assert PROXIES.client_address("10.0.0.5", []) == "10.0.0.5"


def test_the_forwarded_header_and_ipv6() -> None:
    proxies = TrustedProxies(["10.0.0.5", "10.1.0.0/16", "fd00::/8"], "forwarded")
    headers = [(b"forwarded", b'for=1.2.3.4, for="[2001:db8::1]:4711";proto=https, for=fd00::9')]
    assert proxies.client_address("fd00::1", headers) == "2001:db8::1"
    assert proxies.client_address("fd00::1", [(b"forwarded", b"for=unknown")]) == "unknown"


def test_only_the_header_the_proxy_writes_is_read() -> None:
    # The client sent one header, its proxy wrote the other.
    both = [(b"x-forwarded-for", b"10.9.9.9"), (b"forwarded", b"for=198.51.100.7")]
    forwarded = TrustedProxies(["10.0.0.5"], "forwarded")
    assert forwarded.client_address("10.0.0.5", both) == "198.51.100.7"
    assert PROXIES.client_address("10.0.0.5", both) == "10.9.9.9"
    assert PROXIES.client_address("10.0.0.5", both[1:]) == "10.0.0.5"  # none it reads


def test_a_key_counts_by_its_digest() -> None:
    one = key_digest([(b"authorization", b"Bearer iak_a")])
    assert one is not None and b"iak_a" not in one
    assert one == key_digest([(b"authorization", b"Bearer iak_a")])
    assert one != key_digest([(b"authorization", b"Bearer iak_b")])
    assert key_digest([(b"cookie", b"x")]) is None


def test_a_key_counts_as_authentication_reads_it() -> None:
    one = key_digest([(b"authorization", b"Bearer iak_a")])
    for variant in (b"bearer iak_a", b"BEARER  iak_a", b"bEaReR iak_a \t"):
        assert key_digest([(b"authorization", variant)]) == one, variant
    # Headers that carry no bearer key are refused at once; they share one count.
    nothing = key_digest([(b"authorization", b"Basic eDp5")])
    assert nothing == key_digest([(b"authorization", b"Bearer    ")]) != one
