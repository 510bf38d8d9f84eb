"""One client holding sockets cannot keep another out: a per-address share of the connection
cap, and idle sockets give way to new connections at the cap; behind a trusted proxy the share
is the forwarded client's, and one API key has a share whatever addresses it comes from.

The hostile client connects from 127.0.0.2 (Linux answers all of 127/8 on loopback), a proxy
from 127.0.0.3, the other user from 127.0.0.1. Each test ends with an audit of the money
against the answers.
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.db_fixtures import MigratedDatabase
from tests.server.harness import RunningServer, running_server
from tests.server.money_audit import audit_money_against_answers


def _hold_sockets(server: RunningServer, stack: ExitStack, count: int) -> None:
    """`count` half-open connections from 127.0.0.2 that never send a byte."""
    address = urlsplit(server.url)
    for _ in range(count):
        held = stack.enter_context(socket.socket())
        held.bind(("127.0.0.2", 0))
        held.connect((address.hostname, address.port))
    time.sleep(0.5)  # the server has accepted (or refused) every one


def _requests_being_served(
    server: RunningServer, stack: ExitStack, sources: list[str], headers: list[str]
) -> list[socket.socket]:
    """One connection from each address of `sources` whose request sent its headers (those of
    `headers` at the same index) and only the start of its body: a request being served (its
    application waits for the rest)."""
    address = urlsplit(server.url)
    held = []
    for source, extra in zip(sources, headers, strict=True):
        sock = stack.enter_context(socket.socket())
        sock.bind((source, 0))
        sock.connect((address.hostname, address.port))
        sock.sendall(
            f"POST /generate HTTP/1.1\r\nhost: auction\r\ncontent-type: application/json\r\n"
            f"content-length: 100\r\n{extra}\r\n{{".encode()
        )
        held.append(sock)
    time.sleep(0.5)  # the server has read every one
    return held


def _refused(held: list[socket.socket]) -> int:
    """How many of the held connections were answered 503 (the others wait for their body)."""
    refused = 0
    for sock in held:
        sock.settimeout(0.05)
        try:
            answer = sock.recv(4096)
        except TimeoutError:
            continue
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"retry-after: 1" in answer
        refused += 1
    return refused


def _served_alongside(
    server: RunningServer,
    user: str,
    count: int,
    headers: dict[str, str] | None = None,
    **options: Any,
) -> dict[str, str]:
    key = server.create_user(user)
    with server.client(key, **options) as client:
        for i in range(count):
            body = {"rid": f"r{i}", "text": f"q{i}", "bid": "0.01"}
            reply = client.post("/generate", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
    return {f"{user}/r{i}": "served" for i in range(count)}


def test_one_address_holds_only_its_share_of_the_connections(ledger_db: MigratedDatabase) -> None:
    # Before: 30 half-open sockets took all 20 connections; everyone else got 503.
    with (
        running_server(ledger_db, max_connections=20, connection_share_per_client=0.5) as server,
        ExitStack() as stack,
    ):
        _hold_sockets(server, stack, 30)
        outcomes = _served_alongside(server, "other", 5)
        audit_money_against_answers(server.ledger, outcomes)


def test_idle_sockets_give_way_to_new_connections_at_the_cap(ledger_db: MigratedDatabase) -> None:
    with (
        running_server(ledger_db, max_connections=20, connection_share_per_client=1.0) as server,
        ExitStack() as stack,
    ):
        _hold_sockets(server, stack, 20)  # the whole cap, idle
        outcomes = _served_alongside(server, "other", 5)
        audit_money_against_answers(server.ledger, outcomes)


def test_behind_a_trusted_proxy_each_forwarded_client_holds_only_its_share(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: a trusted proxy's connections were exempt from the share, so one client behind
    # it held all 20 connections with requests in progress and the proxy's other clients got
    # 503. The hostile client sends each request with a key of its own (so that only its
    # address binds it) and claims another address further left, which is ignored.
    with (
        running_server(ledger_db, max_connections=20, trusted_proxies=["127.0.0.3"]) as server,
        ExitStack() as stack,
    ):
        headers = [
            f"x-forwarded-for: 10.0.0.{i}, 198.51.100.7\r\n"
            f"authorization: Bearer {server.create_user(f'many{i}', budget=0)}\r\n"
            for i in range(20)
        ]
        held = _requests_being_served(server, stack, ["127.0.0.3"] * 20, headers)
        assert _refused(held) == 15  # 5 of 20: its share
        through_the_proxy = {
            "transport": httpx.HTTPTransport(local_address="127.0.0.3"),
            "headers": {"X-Forwarded-For": "198.51.100.8"},
        }
        outcomes = _served_alongside(server, "other", 5, **through_the_proxy)
        audit_money_against_answers(server.ledger, outcomes)


def test_one_key_from_many_addresses_holds_only_its_share(ledger_db: MigratedDatabase) -> None:
    # Before: 20 addresses each within their own share, all sending one key, held every
    # connection with a request in progress, and the other user got 503.
    with (
        running_server(ledger_db, max_connections=20) as server,
        ExitStack() as stack,
    ):
        key = server.create_user("spread", budget=0)
        sources = [f"127.0.0.{10 + i}" for i in range(20)]
        held = _requests_being_served(
            server, stack, sources, [f"authorization: Bearer {key}\r\n"] * 20
        )
        assert _refused(held) == 15
        outcomes = _served_alongside(server, "other", 5)
        audit_money_against_answers(server.ledger, outcomes)


def test_case_and_space_variants_of_one_key_share_one_share(ledger_db: MigratedDatabase) -> None:
    # Before: the share hashed the raw header, while authentication reads the scheme in any
    # case and strips the key's spaces: `Bearer K`, `bearer K`, `BEARER  K` were one user
    # holding one share each, 15 of 20 from 20 addresses where its share was 5.
    with (
        running_server(ledger_db, max_connections=20) as server,
        ExitStack() as stack,
    ):
        key = server.create_user("variants", budget=0)
        forms = ["Bearer {}", "bearer {}", "BEARER  {}", "bEaReR {} ", "Bearer   {}  "]
        headers = [f"authorization: {forms[i % len(forms)].format(key)}\r\n" for i in range(20)]
        sources = [f"127.0.0.{10 + i}" for i in range(20)]
        held = _requests_being_served(server, stack, sources, headers)
        assert _refused(held) == 15
        outcomes = _served_alongside(server, "other", 5)
        audit_money_against_answers(server.ledger, outcomes)


def test_behind_a_proxy_that_writes_forwarded_a_clients_own_x_forwarded_for_is_ignored(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: the proxy wrote only `Forwarded: for=`, and the client's own `X-Forwarded-For`
    # (a fresh address on every request) was believed first: one real client held 20 of 20.
    with (
        running_server(
            ledger_db,
            max_connections=20,
            trusted_proxies=["127.0.0.3"],
            trusted_proxy_header="forwarded",
        ) as server,
        ExitStack() as stack,
    ):
        headers = [
            f"x-forwarded-for: 10.0.0.{i}\r\n"
            "forwarded: for=198.51.100.7\r\n"
            f"authorization: Bearer {server.create_user(f'many{i}', budget=0)}\r\n"
            for i in range(20)
        ]
        held = _requests_being_served(server, stack, ["127.0.0.3"] * 20, headers)
        assert _refused(held) == 15  # 5 of 20: the share of 198.51.100.7, its real address
        through_the_proxy = {
            "transport": httpx.HTTPTransport(local_address="127.0.0.3"),
            "headers": {"Forwarded": "for=198.51.100.8"},
        }
        outcomes = _served_alongside(server, "other", 5, **through_the_proxy)
        audit_money_against_answers(server.ledger, outcomes)
