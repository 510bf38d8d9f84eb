"""One worker process of a pacing test: bids for one user under a shared plan until a deadline.

Run as `python -m tests.sdk.pacing_worker URL KEY TOTAL START HORIZON_S UNTIL SEED`; every
worker started with the same TOTAL, START and HORIZON_S paces the same plan.
"""

from __future__ import annotations

import random
import string
import sys
import threading
import time
from datetime import datetime, timedelta

from inference_auctions import sdk

THREADS = 3


def main() -> None:
    """Send requests until UNTIL (a Unix time), each worth a random value."""
    url, key, total, start, horizon, until, seed = sys.argv[1:8]
    begin = datetime.fromisoformat(start)
    budget = sdk.Budget(total=total, period=timedelta(seconds=float(horizon)), start=begin)
    deadline = float(until)
    with sdk.AuctionClient(url, key, budget=budget, sync_interval=0.25, max_retries=5) as client:
        counts = {"sent": 0, "exhausted": 0, "failed": 0}
        # When each thread's current call began: a call that takes long holds its bid.
        began = [time.time()] * THREADS

        def loop(index: int) -> None:
            rng = random.Random(f"{seed}-{index}")
            while time.time() < deadline:
                value = f"{rng.uniform(0.001, 0.012):.6f}"
                began[index] = time.time()
                try:
                    # Prompts that part at their first token: requests that share a prefix
                    # are ranked as a group, and near the end of the plan, where the guard
                    # gives what is left to one request and the others go at bid 0, such a
                    # group wins nothing (0 of 40 auctions, against 21 of 40 apart).
                    word = "".join(rng.choices(string.ascii_lowercase, k=8))
                    prompt = f"{word} pace me"
                    client.generate(prompt, value=value, max_new_tokens=2, timeout=10)
                    counts["sent"] += 1
                except sdk.BudgetExhaustedError:
                    counts["exhausted"] += 1
                    time.sleep(0.05)
                except (sdk.APIStatusError, sdk.APIConnectionError) as exc:
                    counts["failed"] += 1
                    print(f"worker {seed}: {exc!r}", file=sys.stderr)
                    time.sleep(0.05)

        def report() -> None:
            # What a test log needs to explain a miss: how this worker paced, second by second.
            while time.time() < deadline:
                time.sleep(2)
                bidder = client.bidder
                print(
                    f"worker {seed} t={time.time() - begin.timestamp():.1f} {counts}"
                    f" alpha={bidder.alpha:.3f} spent={bidder.spent_micros}"
                    f" target={bidder.target_micros:.0f} auctions={bidder.auctions}"
                    f" in_flight={bidder.in_flight_micros} slow_start={bidder.slow_start}"
                    f" longest_call={time.time() - min(began):.1f}s",
                    file=sys.stderr,
                    flush=True,
                )

        threading.Thread(target=report, daemon=True).start()

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


if __name__ == "__main__":
    main()
