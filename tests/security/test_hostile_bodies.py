"""Hostile bodies against a real server on a real port: each gets a 400 or a closed socket,
and none costs another user anything.

Deeply nested JSON, fields over their size limits, ten-megabyte bodies sent eight at a time,
headers and bodies sent too slowly (or not at all), more connections than the cap, clients that
leave mid-body, and rids at the length limit for a user with a long name.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference_auctions.billing.models import ID_LENGTH, NAME_LENGTH
from inference_auctions.server.api.bodies import INLINE_BODY_BYTES
from inference_auctions.server.api.schemas import RID_MAX_LENGTH
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.security.conftest import ledger_snapshot
from tests.server.harness import RunningServer, running_server


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    """A migrated SQLite ledger, for what concerns the HTTP layer rather than the ledger."""
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def _refused(reply: httpx.Response, says: str) -> dict[str, Any]:
    assert reply.status_code == 400, reply.text[:300]
    error: dict[str, Any] = reply.json()["error"]
    assert error["type"] == "invalid_request"
    assert says in error["message"], error
    return error


def test_deep_nesting_is_refused_before_any_walk(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    key = server.create_user("nest")
    caplog.set_level(logging.INFO)
    limit = server.settings.max_json_depth
    before = ledger_snapshot(server.ledger.engine)
    deep_bodies = [
        # 500 deep inside custom_params: a RecursionError (500, thousands of log lines) once.
        {"text": "x", "bid": "0.1", "sampling_params": {"custom_params": {"a": _nested(500)}}},
        {"text": "x", "bid": "0.1", "sampling_params": {"watermark": {"a": _nested(500)}}},
        # One level over the limit, in a key nobody reads.
        {"text": "x", "bid": "0.1", "ignored": _nested(limit)},
    ]
    with server.client(key) as client:
        for body in deep_bodies:
            reply = client.post("/generate", content=json.dumps(body).encode())
            _refused(reply, f"nested too deeply: the limit is {limit} levels")
        for path in ("/v1/completions", "/v1/chat/completions"):
            deep = b'{"prompt": "x", "n": ' + b"[" * 600 + b"]" * 600 + b"}"
            reply = client.post(path, content=deep)
            _refused(reply, "nested too deeply")
    assert ledger_snapshot(server.ledger.engine) == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    # At the limit exactly (the body, sampling_params and custom_params count): served.
    inside = {"a": _nested(limit - 3)}
    body = {"text": "x", "bid": "0.1", "sampling_params": {"custom_params": inside}}
    with server.client(key) as client:
        assert client.post("/generate", json=body).status_code == 200


def test_logit_bias_and_custom_params_have_size_limits(sqlite_db: MigratedDatabase) -> None:
    limits = {"max_logit_bias_entries": 50, "max_custom_params_bytes": 200}
    with running_server(sqlite_db, **limits) as server:
        key = server.create_user("bulk")
        bias = {str(token): 0.5 for token in range(51)}
        custom = {"blob": "x" * 200}
        with server.client(key) as client:
            for params, field, says in [
                ({"logit_bias": bias}, "logit_bias", "51 entries; the limit is 50"),
                ({"custom_params": custom}, "custom_params", "bytes of JSON; the limit is 200"),
            ]:
                body = {"text": "x", "bid": "0.1", "sampling_params": params}
                error = _refused(client.post("/generate", json=body), says)
                assert error["param"] == f"sampling_params.{field}"
            fits = {"logit_bias": dict(list(bias.items())[:50]), "custom_params": {"b": "x"}}
            body = {"text": "x", "bid": "0.1", "sampling_params": fits}
            assert client.post("/generate", json=body).status_code == 200
    defaults = ServerSettings()
    assert defaults.max_json_depth == 32
    assert defaults.max_logit_bias_entries == 4_096
    assert defaults.max_custom_params_bytes == 65_536


def test_large_valid_bodies_are_decoded_off_the_loop_and_served(
    sqlite_db: MigratedDatabase,
) -> None:
    # 100 KB in 5,000 words (the emulator's context is shorter than 40,000 short ones): over
    # INLINE_BODY_BYTES, so a worker process decodes it.
    text = "abcdefghijklmnopqrs " * 5_000
    assert len(text) > INLINE_BODY_BYTES
    bodies = {
        "/generate": {"text": text, "bid": "0.25", "sampling_params": {"max_new_tokens": 2}},
        "/v1/completions": {"prompt": text, "bid": "0.25", "max_tokens": 2},
        "/v1/chat/completions": {
            "messages": [{"role": "user", "content": text}],
            "bid": "0.25",
            "max_tokens": 2,
        },
    }
    with running_server(sqlite_db) as server, server.client(server.create_user("big")) as client:
        for path, body in bodies.items():
            reply = client.post(path, json=body)
            assert reply.status_code == 200, (path, reply.text[:300])
            auction = reply.json().get("auction") or reply.json()["meta_info"]["auction"]
            assert auction["bid_micros"] == 250_000  # exact decimals survive the worker
        typo = client.post("/generate", json={**bodies["/generate"], "bdi": "1"})
        assert _refused(typo, "did you mean 'bid'?")["param"] == "bdi"


# Run in another process, so that building and sending 80 MB costs the server's process
# nothing: eight 10 MB bodies at once (one logit_bias body of 900,000 entries, seven
# custom_params bodies of 1.8 million numbers), then "sent" once all are on the wire.
_FLOOD = """
import sys, threading, httpx
base, key = sys.argv[1], sys.argv[2]
bias = ", ".join(f'"{i}": 0.5' for i in range(900_000))
numbers = ", ".join("0.25" for _ in range(1_800_000))
bodies = [
    f'{{"text": "x", "sampling_params": {{"logit_bias": {{{bias}}}}}}}'.encode(),
    f'{{"text": "x", "sampling_params": {{"custom_params": {{"k": [{numbers}]}}}}}}'.encode(),
]
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
def send(body):
    while True:  # eight bodies in flight until this process is killed, however fast the server
        httpx.post(base + "/generate", content=body, headers=headers, timeout=300)
print("ready", flush=True)
threads = [threading.Thread(target=send, args=(bodies[min(i, 1)],)) for i in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""
# How long another user's latency is measured while eight bodies are being sent and decoded
# (the flood sends them again as soon as each is refused, until it is killed).
_FLOOD_WINDOW_SECONDS = 6.0


def _latency(client: httpx.Client, index: int) -> float:
    body = {"text": f"question {index}", "bid": "0.01", "sampling_params": {"max_new_tokens": 4}}
    started = time.perf_counter()
    reply = client.post("/generate", json=body)
    assert reply.status_code == 200, reply.text
    return time.perf_counter() - started


def test_eight_ten_megabyte_bodies_do_not_stall_another_user(
    sqlite_db: MigratedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference_auctions.server")
    with running_server(sqlite_db) as server:
        mallory = server.create_user("mallory")
        with server.client(server.create_user("olivia")) as client:
            idle = sorted(_latency(client, i) for i in range(15))
            command = [sys.executable, "-c", _FLOOD, server.url, mallory]
            with subprocess.Popen(command, stdout=subprocess.PIPE) as flood:
                assert flood.stdout is not None
                assert flood.stdout.readline().strip() == b"ready"
                time.sleep(1.0)  # the bodies are on the wire and in the decoder
                loaded: list[float] = []
                window = time.monotonic() + _FLOOD_WINDOW_SECONDS
                while time.monotonic() < window:
                    loaded.append(_latency(client, len(loaded)))
                    time.sleep(0.1)  # paced like a user
                still_decoding = flood.poll() is None
                flood.kill()  # the server drops the bodies of clients that left
    assert still_decoding, "the flood was over before the window closed: nothing was measured"
    # The killed client's bodies were dropped, not decoded for nobody (nor waited for at exit).
    left = "left while its body was being decoded"
    dropped = [r for r in caplog.records if left in r.getMessage()]
    assert dropped and all(r.levelname == "INFO" for r in dropped)
    # bench/hostile_bodies.py measures the 2x bound on p99 against a server process of its
    # own; here the server shares this process and a busy machine, so the bound has slack for
    # the machine, while a stalled event loop (seconds per body) would still be far above it.
    assert max(loaded) < 2 * idle[-1] + 2.5, (idle, loaded)
    assert statistics.median(loaded) < 2 * statistics.median(idle) + 0.5, (idle, loaded)


def _read_until_closed(connection: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed it."""
    started = time.monotonic()
    connection.settimeout(limit)
    received = b""
    while True:
        chunk = connection.recv(65536)  # raises TimeoutError if the server keeps it open
        if not chunk:
            return received, time.monotonic() - started
        received += chunk


def test_slow_headers_slow_bodies_and_silent_sockets_are_cut_off(
    sqlite_db: MigratedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inference_auctions.server")
    # The deadline is 1 s here; a batch closes only after 1.5 s, so a request that is read in
    # time but answered later shows that the deadline covers reading only.
    with running_server(
        sqlite_db, http_read_timeout_seconds=1.0, batch_size=64, max_wait_ms=1_500
    ) as server:
        key = server.create_user("loris")
        address = _address(server)
        head = (
            f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        ).encode()
        with (
            socket.create_connection(address) as silent,
            socket.create_connection(address) as slow_head,
            socket.create_connection(address) as slow_body,
        ):
            slow_body.sendall(head + b'{"text": ')
            for index in range(3):  # a byte every 0.3 s: alive, but never done within 1 s
                slow_head.sendall(b"POST /generate HTTP/1.1\r\n"[index : index + 1])
                slow_body.sendall(b" ")
                time.sleep(0.3)
            for connection, answer in [(silent, b"408"), (slow_head, b"408"), (slow_body, b"")]:
                received, waited = _read_until_closed(connection, 10)
                assert waited < 5
                assert received.startswith(b"HTTP/1.1 " + answer) if answer else received == b""
        with server.client(key) as client:
            started = time.monotonic()
            body = {"text": "patient", "bid": "0.1", "sampling_params": {"max_new_tokens": 2}}
            assert client.post("/generate", json=body).status_code == 200
            assert time.monotonic() - started > 1.2
    closed = [r.getMessage() for r in caplog.records if "did not arrive within" in r.getMessage()]
    assert len(closed) == 3, closed
    assert ServerSettings().http_read_timeout_seconds == 30


def test_connections_over_the_cap_are_refused_at_once(sqlite_db: MigratedDatabase) -> None:
    with running_server(sqlite_db, max_connections=4) as server:
        key = server.create_user("many")
        address = _address(server)
        held = [socket.create_connection(address) for _ in range(4)]
        try:
            time.sleep(0.2)  # the server has accepted them
            with socket.create_connection(address) as extra:
                received, waited = _read_until_closed(extra, 5)
            assert received.startswith(b"HTTP/1.1 503"), received
            assert b"too many open connections" in received
            assert waited < 2
        finally:
            for connection in held:
                connection.close()
        deadline = time.monotonic() + 10
        with server.client(key) as client:
            while True:  # the server notices the closed sockets shortly
                try:
                    if client.get("/v1/ledger/balance").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_a_client_gone_mid_body_is_one_info_line(
    sqlite_db: MigratedDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    uvicorn_errors = logging.getLogger("uvicorn.error")  # does not propagate to the root
    uvicorn_errors.addHandler(caplog.handler)
    try:
        with running_server(sqlite_db) as server:
            key = server.create_user("leaver")
            caplog.clear()  # what the server logged while starting
            head = (
                f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            ).encode()
            with socket.create_connection(_address(server)) as connection:
                connection.sendall(head + b'{"text": "' + b"a" * 5000)
                time.sleep(0.3)
            deadline = time.monotonic() + 10
            while not any("disconnected" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.05)
            time.sleep(0.3)  # anything else it would log comes now
            records = list(caplog.records)
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    about_it = [r for r in records if r.name.startswith(("inference_auctions.server", "uvicorn"))]
    assert [(r.levelname, r.name) for r in about_it] == [
        ("INFO", "inference_auctions.server.api.bodies")
    ], [r.getMessage() for r in about_it]
    assert about_it[0].exc_info is None
    assert "5,010 of its 100000 body bytes" in about_it[0].getMessage()


def test_the_rid_limit_is_the_same_for_every_user(server: RunningServer) -> None:
    assert NAME_LENGTH + 1 + RID_MAX_LENGTH <= ID_LENGTH  # "<user>/<rid>" always fits
    long_name = "u" * NAME_LENGTH
    keys = {name: server.create_user(name) for name in ("al", long_name)}
    messages = set()
    for name, key in keys.items():
        with server.client(key) as client:
            body = {"text": "x", "bid": "0.01", "sampling_params": {"max_new_tokens": 1}}
            longest = client.post("/generate", json={**body, "rid": "r" * RID_MAX_LENGTH})
            assert longest.status_code == 200, longest.text
            over = client.post("/generate", json={**body, "rid": "r" * (RID_MAX_LENGTH + 1)})
            error = _refused(over, f"at most {RID_MAX_LENGTH} characters")
            assert error["param"] == "rid"
            messages.add(error["message"])
            assert name + "/" not in over.text
    assert len(messages) == 1


def test_no_error_shows_the_ledger_id_of_a_request(ledger_db: MigratedDatabase) -> None:
    name = "a-rather-long-user-name"
    body = {"text": "x", "bid": "0.5", "rid": "once", "sampling_params": {"max_new_tokens": 1}}
    with running_server(ledger_db) as server:
        key = server.create_user(name)
        with server.client(key) as client:
            assert client.post("/generate", json=body).status_code == 200
    # A new process answers replays from the ledger's records, which key them "<user>/<rid>".
    with running_server(ledger_db) as server, server.client(key) as client:
        for replay in [body, {**body, "bid": "0.6"}]:
            reply = client.post("/generate", json=replay)
            assert reply.status_code == 409, reply.text
            assert "'once'" in reply.text and f"{name}/" not in reply.text
