"""The shared database goes away for a few seconds under two replicas, and comes back.

The machine's PostgreSQL server is shared by other tests, so it is never stopped: both
replicas reach it through a TCP proxy that the test cuts (open connections dropped, new ones
refused) and restores. During the outage every replica answers 503 with `Retry-After`, never
a 500; afterwards both serve again, the requests retried with the same rids are charged once,
and the ledger reconciles.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import pytest
from sqlalchemy.engine import make_url

from inference_auctions.billing import Ledger
from tests.cluster.helpers import charges_by_batch, generate, replica_of
from tests.cluster.tcp_proxy import TcpProxy
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import running_server

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]
GRANT = 10_000_000


def _until_served(url: str, key: str, prompt: str, rid: str) -> tuple[httpx.Response, int]:
    """Retry as a client told `Retry-After` would, until served; also how many 503s it saw."""
    refused = 0
    deadline = time.monotonic() + 30
    while True:
        reply = generate(url, key, prompt, rid=rid, bid="0.4")
        if reply.status_code != 503 or time.monotonic() > deadline:
            return reply, refused
        refused += 1
        time.sleep(0.2)


def test_every_replica_is_503_while_the_database_is_gone_and_recovers(
    postgres_db: MigratedDatabase,
) -> None:
    real = make_url(postgres_db.url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    proxied = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxied_db = MigratedDatabase("postgres", proxied, postgres_db.new_engine())
    ledger = Ledger(postgres_db.engine)  # the test's own view, around the proxy
    keys = {u: ledger.create_user(u, budget_micros=GRANT).api_key for u in ("ann", "ben")}
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(running_server(proxied_db, replica_name=f"replica-{i}"))
            for i in range(2)
        ]
        for index, server in enumerate(replicas):
            reply = generate(server.url, keys["ann"], f"before {index}", bid="0.4")
            assert reply.status_code == 200, reply.text
            assert replica_of(reply) == f"replica-{index}"

        proxy.cut()
        try:
            for index, server in enumerate(replicas):
                for user, key in keys.items():
                    reply = generate(
                        server.url, key, f"{user} during", rid=f"{user}-{index}", bid="0.4"
                    )
                    assert reply.status_code == 503, reply.text
                    assert reply.headers["retry-after"] == "1"
                    error = reply.json()["error"]
                    assert error["type"] == "unavailable" and "ledger" in error["message"]
                health = httpx.get(server.url + "/health", timeout=30)
                assert health.status_code == 503
                assert health.json()["ledger"] == "unavailable"
            time.sleep(2)  # "a few seconds"
        finally:
            proxy.restore()

        # Every client retries its request, same rid, and is served once.
        for index, server in enumerate(replicas):
            for user, key in keys.items():
                reply, _ = _until_served(server.url, key, f"{user} during", f"{user}-{index}")
                assert reply.status_code == 200, reply.text
                assert replica_of(reply) == f"replica-{index}"
            assert httpx.get(server.url + "/health", timeout=30).status_code == 200

    for user in keys:
        charged = charges_by_batch(ledger, user)  # fails on a batch charged twice
        balance = ledger.balance(user)
        assert balance.balance_micros == GRANT - sum(charged.values())
        assert balance.held_micros == 0
        for index in range(2):
            request = ledger.find_request(f"{user}/{user}-{index}")
            assert request is not None and str(request.status) == "served", request
    assert ledger.reconcile().ok
    proxy.cut()
