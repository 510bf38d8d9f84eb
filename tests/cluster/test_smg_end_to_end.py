"""SMG from PyPI in front of two auction servers, each with its own emulated SGLang worker,
both on one PostgreSQL ledger: every part a real process on a real port.

One test, in phases, so the deployment starts once: what SMG sends works (its probes, its
extra keys, streaming, the OpenAI routes); a shared-prefix group lands on one worker; a
tight-budget load spread over both replicas never overdraws and charges once; SIGKILL of one
replica while SMG routes to it: SMG's health checks take it out, the other keeps serving, the
expiry job frees its holds, the recovery procedure refunds what it charged and never answered,
`reconcile` is clean; restarted, SMG takes it back.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from inference_auctions.billing import Ledger
from inference_auctions.server.cluster.supervisor import (
    CLI,
    Child,
    ClusterPlan,
    free_port,
    run_cluster,
    start_engine,
    start_replica,
    wait_healthy,
)
from inference_auctions.server.emulator.live import DEFAULT_MODEL_NAME
from tests.billing.helpers import get_hold
from tests.cluster.helpers import charges_by_batch, generate, replica_of, wait_until
from tests.db_fixtures import MigratedDatabase

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.timeout(150)]

CREDIT = 1_000_000
# Model seconds run 5x faster: a 4-token answer takes some 30 ms, a 1000-token one about 5 s,
# long enough to be caught at the engine by a SIGKILL. (Few long steps rather than many
# short ones: the emulator's own work per step is what a loaded machine slows down.)
TIME_SCALE = 0.2
LONG_ANSWER = 1000
REPLICA_SETTINGS = {
    "batch_size": "8",
    # A 200 ms collection window: requests sent together meet in one auction and hold their
    # bids meanwhile, so tight budgets are refused (402) and batches hold several users.
    "max_wait_ms": "200",
    # Each engine runs one request at a time, and one more is sent to wait inside it, so that
    # a SIGKILL finds requests charged and at the engine (section 4).
    "dispatch_lookahead": "1",
    "rate_limit_per_second": "10000",
    "rate_limit_burst": "10000",
    "run_jobs": "true",
    "hold_max_age_seconds": "8",
    "hold_expiry_interval_seconds": "0.5",
}
SHARED_PREFIX = " ".join(f"context-{i}" for i in range(300))


class Deployment:
    """The test's processes: two emulated SGLang workers it starts itself, then the auction
    servers and SMG from `run_cluster` with `--engine-url`s, as in front of real workers."""

    def __init__(self, database_url: str, logs: Path, stack: ExitStack) -> None:
        self.database_url = database_url
        self.logs = logs
        self.engines = [
            start_engine(
                f"engine-{i}",
                free_port(),
                logs / f"engine-{i}.log",
                time_scale=TIME_SCALE,
                # One request at the engine at a time, which each server learns from it: later
                # ones wait in its pool and clear together, so batches hold several users and
                # charges are above zero.
                max_running_requests=1,
            )
            for i in range(2)
        ]
        for engine in self.engines:
            stack.callback(engine.stop, grace=10)  # after the cluster: callbacks run reversed
        for engine in self.engines:
            wait_healthy(engine)
        plan = ClusterPlan(
            workers=2,
            database_url=database_url,
            log_dir=logs,
            port=free_port(),
            engine_urls=tuple(engine.url for engine in self.engines),
            replica_settings=REPLICA_SETTINGS,
        )
        self.cluster = stack.enter_context(run_cluster(plan))
        self.replicas = self.cluster.replicas  # run_cluster stops whatever is in this list
        assert self.cluster.router is not None
        self.router = self.cluster.router

    def restart(self, index: int) -> Child:
        """Start replica `index` again on its old port, as an operator would (not waited for)."""
        port = int(self.replicas[index].url.rsplit(":", 1)[1])
        self.replicas[index] = start_replica(
            f"replica-{index}",
            port,
            self.engines[index].url,
            self.database_url,
            self.logs / f"replica-{index}-restarted.log",
            replicas=2,
            settings=REPLICA_SETTINGS,
        )
        return self.replicas[index]

    def healthy_workers(self) -> int:
        """How many workers SMG routes to now."""
        return int(httpx.get(self.router.url + "/readiness", timeout=5).json()["healthy_workers"])


@pytest.fixture
def deployment(postgres_db: MigratedDatabase, smg: str, tmp_path: Path) -> Iterator[Deployment]:
    del smg  # only its presence matters
    with ExitStack() as stack:
        yield Deployment(postgres_db.url, tmp_path, stack)


def _stream_events(url: str, path: str, key: str, body: dict[str, object]) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=url, timeout=60) as client,
        client.stream("POST", path, headers=headers, json=body) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        return [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]


def test_two_replicas_behind_smg(deployment: Deployment, postgres_db: MigratedDatabase) -> None:
    started = time.monotonic()
    marks: list[tuple[str, float]] = []

    def mark(phase: str) -> None:  # when each phase ended, printed for -s
        marks.append((phase, round(time.monotonic() - started, 1)))

    ledger = Ledger(postgres_db.engine)
    smg = deployment.router.url
    probe_key = ledger.create_user("probe", budget_micros=10 * CREDIT).api_key
    admin = ledger.create_user("operator", budget_micros=0, admin=True).api_key

    # 1. What SMG sends works: it found both replicas through their unauthenticated probes
    # (the fixture waited for that), and it forwards /generate with its extra keys, streaming
    # and the OpenAI routes, with the Authorization header.
    reply = generate(smg, probe_key, "hello through the router", bid="0.05")
    assert reply.status_code == 200, reply.text
    assert reply.json()["meta_info"]["auction"]["bid_micros"] == 50_000
    assert replica_of(reply) in {"replica-0", "replica-1"}
    events = _stream_events(
        smg,
        "/generate",
        probe_key,
        {
            "text": "a streamed answer",
            "bid": "0.05",
            "stream": True,
            "sampling_params": {"max_new_tokens": 3},
        },
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert "auction" in chunks[0]["meta_info"] and chunks[-1]["meta_info"]["completion_tokens"] == 3
    chat = httpx.post(
        smg + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {probe_key}"},
        json={
            # SMG requires a model, as OpenAI's API does: the one the replicas learnt from their
            # engines (each an `emulate-sglang`).
            "model": DEFAULT_MODEL_NAME,
            "messages": [{"role": "user", "content": "hi"}],
            "bid": "0.05",
            "max_tokens": 3,
        },
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["auction"]["bid_micros"] == 50_000
    assert httpx.post(smg + "/generate", json={"text": "no key"}, timeout=30).status_code == 401

    mark("probes")
    # 2. A shared-prefix group lands on one worker: SMG routes by prefix, never by bid.
    group = [
        generate(smg, probe_key, f"{SHARED_PREFIX} question {i}", bid=f"0.0{i + 1}")
        for i in range(6)
    ]
    assert all(r.status_code == 200 for r in group), [r.text for r in group]
    landed = {replica_of(r) for r in group}
    assert len(landed) == 1, landed
    victim = int(landed.pop().rsplit("-", 1)[1])
    survivor = 1 - victim

    mark("shared prefix")
    # 3. Tight budgets under load spread over both replicas: 4 users with 0.5 credits each
    # send 6 requests at once bidding 0.2: at most two of anyone's holds fit at a time.
    users = {
        f"tight-{i}": ledger.create_user(f"tight-{i}", budget_micros=CREDIT // 2).api_key
        for i in range(4)
    }
    with ThreadPoolExecutor(16) as pool:
        futures = [
            (
                user,
                pool.submit(
                    generate, smg, key, f"{user} topic {j} {secrets.token_hex(6)}", bid="0.2"
                ),
            )
            for j in range(6)
            for user, key in users.items()
        ]
        replies = [(user, future.result()) for user, future in futures]
    statuses = Counter(reply.status_code for _, reply in replies)
    assert set(statuses) <= {200, 402}, [
        r.text for _, r in replies if r.status_code not in (200, 402)
    ]
    assert statuses[200] >= 4 and statuses[402] >= 1, statuses
    served_by = Counter(replica_of(r) for _, r in replies if r.status_code == 200)
    assert set(served_by) == {"replica-0", "replica-1"}, served_by
    for user in users:
        told = {
            r.json()["meta_info"]["auction"]["batch_id"]: r.json()["meta_info"]["auction"][
                "charge_micros"
            ]
            for u, r in replies
            if u == user and r.status_code == 200
        }
        charged = charges_by_batch(ledger, user)
        assert charged == {batch: c for batch, c in told.items() if c > 0}, user
        # Under load each replica's posted floor (on by default) rises: its parts are paid too.
        floors = sum(
            r.json()["meta_info"]["auction"].get("floor_micros", 0)
            for u, r in replies
            if u == user and r.status_code == 200
        )
        floor_entries = ledger.entries(user, kind="floor", limit=1000).entries
        assert -sum(e.amount_micros for e in floor_entries) == floors, user
        balance = ledger.balance(user)
        assert balance.balance_micros == CREDIT // 2 - sum(charged.values()) - floors >= 0
        assert balance.held_micros == 0
    assert sum(sum(charges_by_batch(ledger, u).values()) for u in users) > 0
    assert ledger.reconcile().ok

    mark("tight budgets")
    # 4. SIGKILL the group's replica while SMG routes to it. k1 runs at its engine; k2 is sent
    # to wait inside it (the look-ahead), k3 once k1 ends, both charged; k4 waits in the pool
    # (a hold).
    victims = {
        f"k{i}": ledger.create_user(f"k{i}", budget_micros=CREDIT).api_key for i in range(1, 6)
    }

    def send(user: str, tokens: int) -> Future[httpx.Response]:
        prompt = f"{SHARED_PREFIX} long answer for {user}"
        return pool.submit(
            generate,
            smg,
            victims[user],
            prompt,
            bid="0.3",
            rid=f"{user}-long",
            max_new_tokens=tokens,
        )

    def status(user: str) -> str | None:
        request = ledger.find_request(f"{user}/{user}-long")
        return None if request is None else str(request.status)

    pool = ThreadPoolExecutor(5)
    try:
        # k1 runs long enough for k2 and k3 to arrive behind it even on a loaded machine.
        outcomes = {"k1": send("k1", LONG_ANSWER * 3 // 5)}
        wait_until(lambda: status("k1") == "scheduled", 15, "k1 at the engine")
        outcomes |= {"k2": send("k2", LONG_ANSWER), "k3": send("k3", LONG_ANSWER)}
        wait_until(
            lambda: status("k2") == "scheduled" and status("k3") == "scheduled",
            30,
            "k2 and k3 settled together and at the engine",
        )
        outcomes["k4"] = send("k4", 4)
        # k5 reached the replica without SMG (a client inside the network): nobody retries it.
        outcomes["k5"] = pool.submit(
            generate,
            deployment.replicas[victim].url,
            victims["k5"],
            "k5 straight to the replica",
            bid="0.3",
            rid="k5-long",
        )
        wait_until(
            lambda: all(get_hold(ledger, f"{u}/{u}-long") is not None for u in ("k4", "k5")),
            15,
            "k4's and k5's holds",
        )
        charged_k23 = {u: CREDIT - ledger.balance(u).balance_micros for u in ("k2", "k3")}
        assert sum(charged_k23.values()) > 0, charged_k23  # two bidders: someone paid
        deployment.replicas[victim].kill()

        # SMG's health checks take it out; the survivor keeps serving.
        wait_until(lambda: deployment.healthy_workers() == 1, 15, "SMG dropped the dead replica")
        after = [generate(smg, probe_key, f"after the crash {i}") for i in range(4)]
        assert [r.status_code for r in after] == [200] * 4, [r.text for r in after]
        assert {replica_of(r) for r in after} == {f"replica-{survivor}"}
        # The victim's clients lost their answers; SMG may have retried them on the survivor,
        # which never serves a settled rid again (409) and serves one whose hold is open.
        results: dict[str, int | str] = {}
        for user, future in outcomes.items():
            try:
                results[user] = future.result(timeout=60).status_code
            except httpx.TransportError as error:
                results[user] = type(error).__name__
    finally:
        pool.shutdown(wait=True)
    assert results["k1"] == 200, results
    assert results["k2"] != 200 and results["k3"] != 200, results

    assert results["k5"] == "RemoteProtocolError", results
    # k5's hold is freed by the survivor's expiry job; so is k4's, unless SMG's retry got it
    # served by the survivor on that same hold.
    wait_until(
        lambda: ledger.balance("k4").held_micros == ledger.balance("k5").held_micros == 0,
        20,
        "the dead replica's holds released",
    )
    k5 = get_hold(ledger, "k5/k5-long")
    assert k5 is not None and str(k5.state) == "released", k5
    assert ledger.balance("k5").balance_micros == CREDIT
    k4 = get_hold(ledger, "k4/k4-long")
    assert k4 is not None
    if results["k4"] == 200:
        assert str(k4.state) == "settled"
    else:
        assert str(k4.state) == "released", k4

    mark("sigkill")
    # 5. The operator restarts the dead replica (it starts while the rest goes on) and runs
    # the recovery procedure from the survivor's side: it refunds what the dead replica
    # charged and never answered, once.
    restarted = deployment.restart(victim)
    recover = [*CLI, "ledger", "refund-unserved", "--older-than", "1"]
    recover += ["--database-url", deployment.database_url]
    done = subprocess.run(recover, capture_output=True, text=True, timeout=60, check=False)
    paid = sum(1 for charge in charged_k23.values() if charge > 0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(f"\n{paid} refunds."), done.stdout
    for user in ("k2", "k3"):
        assert ledger.balance(user).balance_micros == CREDIT, user
        request = ledger.find_request(f"{user}/{user}-long")
        assert request is not None and str(request.status) == "failed"
    assert ledger.refund_unserved(timedelta(seconds=1)) == []  # a second run refunds nothing
    # `reconcile` is clean, asked of the survivor: the answer is the whole deployment's.
    with httpx.Client(base_url=deployment.replicas[survivor].url, timeout=60) as client:
        checked = client.get("/v1/admin/reconcile", headers={"Authorization": f"Bearer {admin}"})
    assert checked.status_code == 200, checked.text
    assert checked.json()["ok"] and checked.json()["scope"] == "deployment", checked.json()
    for user in [*users, *victims, "probe"]:
        balance = ledger.balance(user)
        assert balance.held_micros == 0 and balance.balance_micros >= 0, user
    # SMG's retries on the survivor charged nobody twice: one long request each, so at most
    # one charge each, whichever replica settled it.
    for user in victims:
        assert len(charges_by_batch(ledger, user)) <= 1, user

    mark("recovery")
    # 6. Back on its port, SMG takes it back and routes to it again.
    wait_healthy(restarted)
    wait_until(lambda: deployment.healthy_workers() == 2, 20, "SMG took the replica back")
    back: list[httpx.Response] = []
    while len(back) < 16 and f"replica-{victim}" not in {replica_of(r) for r in back}:
        back.append(generate(smg, probe_key, f"{secrets.token_hex(8)} fresh topic {len(back)}"))
    assert all(r.status_code == 200 for r in back), [r.text for r in back]
    assert replica_of(back[-1]) == f"replica-{victim}", [replica_of(r) for r in back]
    assert ledger.reconcile().ok
    mark("restart")
    print(f"scale-out end-to-end, seconds at the end of each phase: {marks}; victims {results}")
