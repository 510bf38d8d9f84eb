"""Replicas sharing a ledger clear under one pricing rule: this process's, recorded while it
runs (`billing.replica_rules`). A process whose rule differs from another live one's refuses
to start, naming the other and both rules, and when the other's row lapses if it crashed.

Each process draws a random id at start, so that replicas are told apart whatever their names
(every host started with `--host 0.0.0.0` has the default name `0.0.0.0:8000`).

The heartbeat that keeps the row live is also this process's write to the ledger on a
schedule: a ledger that answers reads but refuses writes is seen within one beat even when no
request comes (`cannot_write`, which `/health` reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta

from inference_auctions.billing import Ledger, ReplicaProcess, RuleDisagreement
from inference_auctions.server.cluster.replica import replica_name
from inference_auctions.server.settings import ServerSettings

log = logging.getLogger(__name__)

# A process silent for LIVE_WITHIN is taken for stopped; it says it is live more often than
# that (`ledger_heartbeat_seconds`, at most a third of it).
LIVE_WITHIN = timedelta(seconds=30)


class RuleAgreement:
    """This process's rule in the ledger, from `start` (which refuses a disagreeing one) to
    `stop`, renewed every `ledger_heartbeat_seconds`."""

    def __init__(self, ledger: Ledger, settings: ServerSettings) -> None:
        rule = settings.auction_rule()
        self._ledger = ledger
        self._process = ReplicaProcess(
            id=uuid.uuid4().hex,
            replica=replica_name(settings),
            host=socket.gethostname()[:255] or "an unnamed host",
            pid=os.getpid(),
            started_at=datetime.now(UTC),
        )
        self._every = settings.ledger_heartbeat_seconds
        # Under `pricing tiers` the tiers sold must agree too (the mode is the rule's name).
        self._rule = (rule.name, rule.slots, rule.request_fee_micros, settings.tiers_signature())
        self._task: asyncio.Task[None] | None = None
        # (when, the error's kind) of the last heartbeat, if it failed.
        self._failed: tuple[float, str] | None = None

    async def start(self) -> None:
        """Record the rule; raises `RuleDisagreement` if another live process's differs."""
        await asyncio.to_thread(self._ledger.join_replicas, self._process, self._rule, LIVE_WITHIN)
        self._task = asyncio.create_task(self._beat(), name="replica-rule-heartbeat")

    async def stop(self) -> None:
        """Stop saying so, and forget this process's row (only its own)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await asyncio.to_thread(self._ledger.leave_replicas, self._process)
        except Exception as error:  # its row goes stale by itself
            log.warning("forgetting this replica's pricing rule failed: %s", error)

    def cannot_write(self) -> str | None:
        """Why the ledger cannot write, if this process's last heartbeat failed; None when it
        succeeded (or none has run yet)."""
        failed = self._failed
        if failed is None:
            return None
        return f"its heartbeat write failed {time.monotonic() - failed[0]:.0f} s ago ({failed[1]})"

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await asyncio.to_thread(
                    self._ledger.replica_heartbeat, self._process, self._rule, LIVE_WITHIN
                )
            except RuleDisagreement as error:
                # This process could not write for longer than the window, and meanwhile a
                # replica under another rule started: the deployment's prices now disagree.
                self._failed = None
                log.error("this replica's pricing rule lapsed and another one runs: %s", error)
            except Exception as error:  # the ledger cannot write: the next beat tries again
                # The error's kind only: a database's message may quote statements and values.
                self._failed = (time.monotonic(), type(error).__name__)
                log.warning("recording this replica's pricing rule failed: %s", error)
            else:
                self._failed = None
