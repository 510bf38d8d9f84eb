"""What one replica tells about itself: its name on metrics, health and every response; the
router's probes answered without a key; its share of the rate limit; the deployment-wide or
per-replica scope of admin answers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inference_auctions.server.cluster.replica import (
    REPLICA_HEADER,
    ReplicaLabelled,
    rate_limit_share,
)
from inference_auctions.server.cluster.smg import SMGMissing, find_smg
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase, migrated_database
from tests.server.harness import running_server


def test_every_sample_carries_the_replica_label() -> None:
    registry = CollectorRegistry()
    plain = Counter("plain", "no labels", registry=registry)
    labelled = Counter("by_status", "a label", ["status"], registry=registry)
    plain.inc(3)
    labelled.labels(status="served").inc()
    text = generate_latest(ReplicaLabelled(registry, "gpu-7")).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert samples and all(s.labels["replica"] == "gpu-7" for s in samples)
    assert {"status": "served", "replica": "gpu-7"} in [s.labels for s in samples]
    assert "# HELP plain_total no labels" in text  # names and help text are unchanged


@pytest.mark.parametrize(
    ("rate", "burst", "replicas", "share"),
    [(200.0, 400, 1, (200.0, 400)), (10.0, 5, 2, (5.0, 2)), (1.0, 3, 8, (0.125, 1))],
)
def test_each_replica_enforces_its_share_and_the_shares_never_exceed_the_limit(
    rate: float, burst: int, replicas: int, share: tuple[float, int]
) -> None:
    settings = ServerSettings(
        rate_limit_per_second=rate, rate_limit_burst=burst, rate_limit_replicas=replicas
    )
    assert rate_limit_share(settings) == share
    # The burst shares add up to at most the burst, unless it is below one per replica.
    assert share[1] * replicas <= max(burst, replicas)


def test_a_missing_smg_names_the_way_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SMGMissing, match=r"pip install smg"):
        find_smg()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[MigratedDatabase]:
    with migrated_database("sqlite", tmp_path) as db:
        yield db


def test_a_replica_names_itself_and_answers_the_routers_probes_without_a_key(
    sqlite_db: MigratedDatabase,
) -> None:
    with running_server(sqlite_db, replica_name="gpu-3") as server:
        admin = server.create_user("root", admin=True)
        with httpx.Client(base_url=server.url, timeout=30) as anonymous:
            # SMG probes these four with no key before it routes to a worker.
            for path in ("/health", "/v1/models", "/server_info", "/version"):
                reply = anonymous.get(path)
                assert reply.status_code == 200, (path, reply.text)
                assert reply.headers[REPLICA_HEADER] == "gpu-3"
            assert anonymous.get("/health").json()["replica"] == "gpu-3"
            assert anonymous.get("/server_info").json()["replica"] == "gpu-3"
            assert anonymous.get("/version").json()["version"]
            metrics = anonymous.get("/metrics").text
            samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]
            assert samples and all(s.labels.get("replica") == "gpu-3" for s in samples)
            # Everything else still needs a key, and even a refusal names the replica.
            refused = anonymous.post("/generate", json={"text": "x"})
            assert refused.status_code == 401 and refused.headers[REPLICA_HEADER] == "gpu-3"
        with server.client(admin) as client:
            assert client.get("/v1/admin/reconcile").json()["scope"] == "deployment"
            timings = client.get("/v1/admin/timings").json()
            assert (timings["scope"], timings["replica"]) == ("replica", "gpu-3")


def test_without_a_name_a_replica_is_its_address_and_its_metrics_are_unlabelled(
    sqlite_db: MigratedDatabase,
) -> None:
    with running_server(sqlite_db) as server:
        reply = httpx.get(server.url + "/health", timeout=30)
        assert reply.json()["replica"] == f"{server.settings.host}:{server.settings.port}"
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]
        assert samples and not any("replica" in s.labels for s in samples)


# What SMG 1.13 adds to the bodies it forwards (docs/SCALE-OUT.md): SGLang ignores these keys,
# and so must every replica, or SMG could not route to it at all.
SMG_GENERATE_KEYS = {
    "model": "unknown",
    "log_metrics": True,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "return_text_in_logprobs": False,
    "stream": False,
    "priority": 0,
}


def test_the_keys_smg_adds_to_a_body_are_accepted(sqlite_db: MigratedDatabase) -> None:
    with running_server(sqlite_db) as server, server.client(server.create_user("u")) as client:
        generated = client.post(
            "/generate",
            json={
                "text": "routed",
                "bid": "0.2",
                "rid": "smg-1",
                **SMG_GENERATE_KEYS,
                "sampling_params": {"max_new_tokens": 2},
            },
        )
        assert generated.status_code == 200, generated.text
        assert generated.json()["meta_info"]["auction"]["bid_micros"] == 200_000
        chat = client.post(
            "/v1/chat/completions",
            json={
                "model": "inference-auction-emulated",
                "bid": "0.2",
                "priority": 0,
                "logprobs": False,
                "stream": False,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "routed"}],
            },
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["auction"]["bid_micros"] == 200_000
