"""The SGLang emulator: an engine that behaves like SGLang 0.5.23, without a GPU.

* The pure core: `RadixCache`, `CostModel` and the discrete-event `EngineSimulator` (no I/O,
  no clock: the experiments drive it on a simulated clock).
* `LiveSimulator` runs it in real time; `EmbeddedEngine` serves it in the auction server's
  process through the engine protocol (`server.engine`); `create_sglang_app` serves it with
  SGLang's HTTP API (`inference-auction emulate-sglang`).

The emulator imports the engine's protocol; the serving path never imports the emulator.

Names are imported on first use, so that the pure core (`server.emulator.simulator` and what it
needs) loads without the web stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_auctions.server.emulator.cost_model import CostModel
    from inference_auctions.server.emulator.embedded import EmbeddedEngine
    from inference_auctions.server.emulator.live import LiveRequest, LiveSimulator
    from inference_auctions.server.emulator.radix_cache import RadixCache
    from inference_auctions.server.emulator.sglang_app import create_sglang_app
    from inference_auctions.server.emulator.simulator import (
        EngineSimulator,
        RequestOutcome,
        SimRequest,
        Step,
    )

_MODULES = {
    "CostModel": "inference_auctions.server.emulator.cost_model",
    "EmbeddedEngine": "inference_auctions.server.emulator.embedded",
    "EngineSimulator": "inference_auctions.server.emulator.simulator",
    "LiveRequest": "inference_auctions.server.emulator.live",
    "LiveSimulator": "inference_auctions.server.emulator.live",
    "RadixCache": "inference_auctions.server.emulator.radix_cache",
    "RequestOutcome": "inference_auctions.server.emulator.simulator",
    "SimRequest": "inference_auctions.server.emulator.simulator",
    "Step": "inference_auctions.server.emulator.simulator",
    "create_sglang_app": "inference_auctions.server.emulator.sglang_app",
}

__all__ = [
    "CostModel",
    "EmbeddedEngine",
    "EngineSimulator",
    "LiveRequest",
    "LiveSimulator",
    "RadixCache",
    "RequestOutcome",
    "SimRequest",
    "Step",
    "create_sglang_app",
]


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
