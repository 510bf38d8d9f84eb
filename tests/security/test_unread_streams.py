"""A stream nobody reads cannot hold its connection, nor its request at the engine.

The client below asks for a long streamed answer and never reads a byte of it: once the
server's buffers for it stay full for the write deadline, the connection is dropped, the
request stopped at the engine and recorded as left by its client (docs/SPEC.md 1a).
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

from tests.db_fixtures import MigratedDatabase
from tests.server.harness import running_server
from tests.server.money_audit import audit_money_against_answers


def test_a_stream_nobody_reads_is_dropped_at_the_write_deadline(
    ledger_db: MigratedDatabase,
) -> None:
    # Before: such a stream stayed open (and generating) as long as the engine would go on.
    with running_server(
        ledger_db, http_write_timeout_seconds=1.0, emulator_time_scale=0.05
    ) as server:
        key = server.create_user("mute", budget=10_000_000)
        address = urlsplit(server.url)
        body = json.dumps(
            {
                "rid": "mute",
                "text": "never read",
                "bid": "0.01",
                "stream": True,
                "sampling_params": {"max_new_tokens": 8_000, "ignore_eos": True},
            }
        ).encode()
        head = (
            f"POST /generate HTTP/1.1\r\nhost: {address.netloc}\r\n"
            f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.socket() as mute:
            mute.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            mute.connect((address.hostname, address.port))
            mute.sendall(head + body)
            deadline = time.monotonic() + 8
            while True:  # never reads: waits for the ledger to say the client left
                found = server.ledger.find_request("mute/mute")
                if found is not None and str(found.status) != "scheduled":
                    break
                assert time.monotonic() < deadline, "the unread stream is still open"
                time.sleep(0.1)
        audit_money_against_answers(server.ledger, {"mute/mute": "abandoned"})
