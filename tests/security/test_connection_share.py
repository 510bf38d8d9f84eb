"""One client holding sockets cannot keep another out: a per-address share of the connection
cap, and idle sockets give way to new connections at the cap.

The hostile client connects from 127.0.0.2 (Linux answers all of 127/8 on loopback), the
other user from 127.0.0.1. Each test ends with an audit of the money against the answers.
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack
from urllib.parse import urlsplit

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


def _served_alongside(server: RunningServer, user: str, count: int) -> dict[str, str]:
    key = server.create_user(user)
    with server.client(key) as client:
        for i in range(count):
            reply = client.post("/generate", json={"rid": f"r{i}", "text": f"q{i}", "bid": "0.01"})
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
