"""The auction service driven in process (no HTTP) on a real ledger and the embedded engine,
so that several requests can arrive in one turn of the event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from inference_auctions.billing import Ledger
from inference_auctions.server.engine_choice import make_engine
from inference_auctions.server.serving.admission import Admission, payload_fingerprint
from inference_auctions.server.serving.service import AuctionService
from inference_auctions.server.serving.tickets import Ticket
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS


@asynccontextmanager
async def running_service(db: MigratedDatabase) -> AsyncIterator[AuctionService]:
    """A started service on `db`, batches closing at once; drained and stopped afterwards."""
    settings = ServerSettings(database_url=db.url, **{**TEST_SETTINGS, "max_wait_ms": 0})
    engine = make_engine(None, time_scale=0.002, timeout=None)
    await engine.start()
    service = AuctionService(settings, Ledger(db.new_engine()), engine)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
        await engine.close()


async def admit(
    service: AuctionService,
    user: str,
    rid: str,
    bid: int,
    *,
    prompt: Sequence[int] | None = None,
    max_new_tokens: int = 2,
) -> Ticket:
    """Admit one request as the routes would (8 prompt tokens unless `prompt` is given)."""
    tokens = np.array(range(1, 9) if prompt is None else prompt, dtype=np.int32)
    tokens.flags.writeable = False
    payload: dict[str, Any] = {"rid": rid, "bid": bid}
    if prompt is not None:
        payload["prompt"] = list(prompt)
    return await service.admit(
        Admission(
            user=user,
            rid=rid,
            tokens=tokens,
            bid_micros=bid,
            sampling_params={"max_new_tokens": max_new_tokens},
            fingerprint=payload_fingerprint(payload),
        )
    )
