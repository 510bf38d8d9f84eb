"""How a batch's requests reach an engine, and the emulated engine behind it.

* The protocol the server programs against: `Engine`, `EngineRequest`, `Generation`,
  `EngineChunk`, `EngineResult`, and the `EngineError` hierarchy (`server.engine.errors`).
* Engines: `SGLangHTTPEngine` (a real SGLang server, `priority` or `ordered` mode) and
  `EmbeddedEngine` (the emulator in process); `make_engine` picks one.
* The emulator: the pure core, `RadixCache`, `CostModel` and the discrete-event
  `EngineSimulator` (no I/O, no clock: the experiments drive it on a simulated clock);
  `LiveSimulator` runs it in real time; `create_sglang_app` serves it with SGLang's HTTP API.

Names are imported on first use, so that the pure core (`server.engine.simulator` and what it
needs) loads without the web stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_auctions.server.engine.base import (
        DispatchMode,
        Engine,
        EngineChunk,
        EngineRequest,
        EngineResult,
        Usage,
    )
    from inference_auctions.server.engine.cost_model import CostModel
    from inference_auctions.server.engine.embedded import EmbeddedEngine
    from inference_auctions.server.engine.errors import (
        EngineError,
        EngineProtocolError,
        EngineRejected,
        EngineServerError,
        EngineTimeout,
        EngineUnavailable,
        TokenizerMismatch,
    )
    from inference_auctions.server.engine.factory import make_engine
    from inference_auctions.server.engine.generation import Generation
    from inference_auctions.server.engine.live import LiveRequest, LiveSimulator
    from inference_auctions.server.engine.radix_cache import RadixCache
    from inference_auctions.server.engine.sglang_app import create_sglang_app
    from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine
    from inference_auctions.server.engine.simulator import (
        EngineSimulator,
        RequestOutcome,
        SimRequest,
        Step,
    )

_MODULES = {
    "CostModel": "inference_auctions.server.engine.cost_model",
    "DispatchMode": "inference_auctions.server.engine.base",
    "EmbeddedEngine": "inference_auctions.server.engine.embedded",
    "Engine": "inference_auctions.server.engine.base",
    "EngineChunk": "inference_auctions.server.engine.base",
    "EngineError": "inference_auctions.server.engine.errors",
    "EngineProtocolError": "inference_auctions.server.engine.errors",
    "EngineRejected": "inference_auctions.server.engine.errors",
    "EngineRequest": "inference_auctions.server.engine.base",
    "EngineResult": "inference_auctions.server.engine.base",
    "EngineServerError": "inference_auctions.server.engine.errors",
    "EngineSimulator": "inference_auctions.server.engine.simulator",
    "EngineTimeout": "inference_auctions.server.engine.errors",
    "EngineUnavailable": "inference_auctions.server.engine.errors",
    "Generation": "inference_auctions.server.engine.generation",
    "LiveRequest": "inference_auctions.server.engine.live",
    "LiveSimulator": "inference_auctions.server.engine.live",
    "RadixCache": "inference_auctions.server.engine.radix_cache",
    "RequestOutcome": "inference_auctions.server.engine.simulator",
    "SGLangHTTPEngine": "inference_auctions.server.engine.sglang_http",
    "SimRequest": "inference_auctions.server.engine.simulator",
    "Step": "inference_auctions.server.engine.simulator",
    "TokenizerMismatch": "inference_auctions.server.engine.errors",
    "Usage": "inference_auctions.server.engine.base",
    "create_sglang_app": "inference_auctions.server.engine.sglang_app",
    "make_engine": "inference_auctions.server.engine.factory",
}

__all__ = [
    "CostModel",
    "DispatchMode",
    "EmbeddedEngine",
    "Engine",
    "EngineChunk",
    "EngineError",
    "EngineProtocolError",
    "EngineRejected",
    "EngineRequest",
    "EngineResult",
    "EngineServerError",
    "EngineSimulator",
    "EngineTimeout",
    "EngineUnavailable",
    "Generation",
    "LiveRequest",
    "LiveSimulator",
    "RadixCache",
    "RequestOutcome",
    "SGLangHTTPEngine",
    "SimRequest",
    "Step",
    "TokenizerMismatch",
    "Usage",
    "create_sglang_app",
    "make_engine",
]


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'inference_auctions.server.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
