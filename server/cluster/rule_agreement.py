"""Replicas sharing a ledger clear under one pricing rule: this replica's, recorded while it
runs (`billing.replica_rules`). A replica whose rule differs from another live one's refuses
to start, naming the other and both rules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from inference_auctions.billing import Ledger
from inference_auctions.server.cluster.replica import replica_name
from inference_auctions.server.settings import ServerSettings

log = logging.getLogger(__name__)

# A replica says it is live this often; one silent for LIVE_WITHIN is taken for stopped.
HEARTBEAT_SECONDS = 10.0
LIVE_WITHIN = timedelta(seconds=30)


class RuleAgreement:
    """This replica's rule in the ledger, from `start` (which refuses a disagreeing one) to
    `stop`."""

    def __init__(self, ledger: Ledger, settings: ServerSettings) -> None:
        rule = settings.auction_rule()
        self._ledger = ledger
        self._replica = replica_name(settings)
        # Under `pricing tiers` the tiers sold must agree too (the mode is the rule's name).
        self._rule = (rule.name, rule.slots, rule.request_fee_micros, settings.tiers_signature())
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Record the rule; raises `RuleDisagreement` if another live replica's differs."""
        await asyncio.to_thread(self._ledger.join_replicas, self._replica, self._rule, LIVE_WITHIN)
        self._task = asyncio.create_task(self._beat(), name="replica-rule-heartbeat")

    async def stop(self) -> None:
        """Stop saying so, and forget this replica's row."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await asyncio.to_thread(self._ledger.leave_replicas, self._replica)
        except Exception as error:  # its row goes stale by itself
            log.warning("forgetting this replica's pricing rule failed: %s", error)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await asyncio.to_thread(self._ledger.replica_heartbeat, self._replica, self._rule)
            except Exception as error:  # the ledger is down: the next beat tries again
                log.warning("recording this replica's pricing rule failed: %s", error)
