"""A started server has frozen its startup heap out of the cycle collector's reach and collects
the young generation less often (`server.gc_tuning`); a request still serves afterwards."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest

from inference_auctions.server.app import create_app
from inference_auctions.server.emulator.embedded import EmbeddedEngine
from inference_auctions.server.gc_tuning import YOUNG_THRESHOLD
from inference_auctions.server.settings import ServerSettings
from tests.db_fixtures import MigratedDatabase
from tests.server.harness import TEST_SETTINGS


@pytest.fixture
def collector_as_python_sets_it() -> Iterator[None]:
    """CPython's own settings before the test and after it (the test process is shared)."""
    saved = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)


@pytest.mark.anyio
@pytest.mark.usefixtures("collector_as_python_sets_it")
async def test_a_started_server_freezes_its_heap_and_collects_less_often(
    ledger_db: MigratedDatabase,
) -> None:
    app = create_app(
        ServerSettings(database_url=ledger_db.url, **TEST_SETTINGS),
        engine=EmbeddedEngine(time_scale=0.002),
    )
    assert gc.get_freeze_count() == 0

    async with app.router.lifespan_context(app):
        # Everything the startup built (the modules, the app, the engine) is frozen.
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            reply = await client.get("/health")
            assert reply.status_code == 200
