"""What an operator sees of a running server: liveness apart from readiness, process metrics,
refused requests counted, and the W3C trace headers passed on to the engine.

Each against a real server on a real port (SQLite and PostgreSQL); the engine, where its side
matters, is `FaultySGLang` on a loopback port, which records the headers of each `/generate`.
"""

from __future__ import annotations

import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.db_fixtures import MigratedDatabase
from tests.faults.faulty_sglang import FaultySGLang
from tests.server.harness import RunningServer, running_server

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "vendor=opaque-value,other=1"


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `/metrics`, by name and sorted labels."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_refused_requests_are_counted_by_status_and_reason(server: RunningServer) -> None:
    broke = server.create_user("broke", budget=0)
    rich = server.create_user("rich")
    with server.client(broke) as client:
        for _ in range(2):
            reply = client.post("/generate", json={"text": "a b", "bid": "0.5"})
            assert reply.status_code == 402, reply.text
    with server.client("iak_not-a-key") as client:
        assert client.post("/generate", json={"text": "a", "bid": "0"}).status_code == 401
    with server.client(rich) as client:
        bad = client.post("/generate", json={"text": "a", "bid": "-1"})
        assert bad.status_code == 400
        assert client.post("/generate", json={"text": "a b", "bid": "0.01"}).status_code == 200
    samples = _samples(server.url)
    refused = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "inference_auction_refused_requests_total"
    }
    assert refused == {
        (("reason", "insufficient_funds"), ("status", "402")): 2.0,
        (("reason", "unauthenticated"), ("status", "401")): 1.0,
        (("reason", "invalid_request"), ("status", "400")): 1.0,
    }
    # The served request is counted where it always was, not as a refusal.
    assert samples[("inference_auction_requests_total", (("status", "served"),))] == 1.0


def test_rate_limited_requests_are_counted(ledger_db: MigratedDatabase) -> None:
    with running_server(ledger_db, rate_limit_per_second=0.001, rate_limit_burst=1) as server:
        key = server.create_user("hasty")
        with server.client(key) as client:
            first = client.post("/generate", json={"text": "a b", "bid": "0.01"})
            assert first.status_code == 200, first.text
            second = client.post("/generate", json={"text": "a b", "bid": "0.01"})
            assert second.status_code == 429
        samples = _samples(server.url)
    key_429 = (
        "inference_auction_refused_requests_total",
        (("reason", "rate_limited"), ("status", "429")),
    )
    assert samples[key_429] == 1.0


def test_process_metrics_are_exported(server: RunningServer) -> None:
    samples = _samples(server.url)
    names = {name for name, _ in samples}
    info = [labels for name, labels in samples if name == "python_info"]
    assert len(info) == 1
    assert dict(info[0])["major"] == str(sys.version_info.major)
    if sys.platform == "linux":
        assert samples[("process_resident_memory_bytes", ())] > 10 * 2**20
        assert samples[("process_cpu_seconds_total", ())] > 0
        assert {"process_open_fds", "process_max_fds", "process_start_time_seconds"} <= names


def test_liveness_holds_while_the_engine_is_down(ledger_db: MigratedDatabase) -> None:
    faulty = FaultySGLang("ok")
    engine = faulty.serve()
    engine_url = engine.__enter__()
    try:
        with running_server(ledger_db, engine_url=engine_url) as server:
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            engine.__exit__(None, None, None)  # SGLang goes away; the server stays
            ready = httpx.get(server.url + "/health", timeout=10)
            assert ready.status_code == 503
            assert ready.json()["status"] == "engine unavailable"
            live = httpx.get(server.url + "/health/live", timeout=10)
            assert live.status_code == 200, live.text
            assert live.json()["status"] == "alive"
    finally:
        engine.__exit__(None, None, None)  # a second exit after the first changes nothing


def test_trace_headers_go_on_to_the_engine(ledger_db: MigratedDatabase) -> None:
    faulty = FaultySGLang("ok")
    with faulty.serve() as url, running_server(ledger_db, engine_url=url) as server:
        key = server.create_user("alice")
        with server.client(key) as client:
            traced = client.post(
                "/generate",
                json={"text": "a b c", "bid": "0.01", "rid": "traced"},
                headers={"traceparent": TRACEPARENT, "tracestate": TRACESTATE},
            )
            assert traced.status_code == 200, traced.text
            chat = client.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "a b"}],
                    "bid": "0.01",
                    "max_tokens": 3,
                    "stream": True,
                    "rid": "traced-chat",
                },
                headers={"traceparent": TRACEPARENT},
            )
            assert chat.status_code == 200, chat.text
            plain = client.post("/generate", json={"text": "a b c", "bid": "0.01", "rid": "plain"})
            assert plain.status_code == 200, plain.text
            odd = client.post(
                "/generate",
                json={"text": "a b c", "bid": "0.01", "rid": "odd"},
                headers={"traceparent": b"00-\xffab\tcd", "tracestate": "a=1"},
            )
            assert odd.status_code == 200, odd.text
    sent = {received.rid.removeprefix("alice/"): received for received in faulty.received}
    assert sent["traced"].trace_headers == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    assert sent["traced-chat"].trace_headers == {"traceparent": TRACEPARENT}
    assert sent["plain"].trace_headers == {}  # nothing made up, nothing left from the others
    assert sent["odd"].trace_headers == {"tracestate": "a=1"}  # not printable ASCII: dropped
