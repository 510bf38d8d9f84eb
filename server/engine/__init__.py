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
    from server.engine.base import (
        DispatchMode,
        Engine,
        EngineChunk,
        EngineRequest,
        EngineResult,
        Usage,
    )
    from server.engine.cost_model import CostModel
    from server.engine.embedded import EmbeddedEngine
    from server.engine.errors import (
        EngineError,
        EngineProtocolError,
        EngineRejected,
        EngineServerError,
        EngineTimeout,
        EngineUnavailable,
    )
    from server.engine.factory import make_engine
    from server.engine.generation import Generation
    from server.engine.live import LiveRequest, LiveSimulator
    from server.engine.radix_cache import RadixCache
    from server.engine.sglang_app import create_sglang_app
    from server.engine.sglang_http import SGLangHTTPEngine
    from server.engine.simulator import EngineSimulator, RequestOutcome, SimRequest, Step

_MODULES = {
    "CostModel": "server.engine.cost_model",
    "DispatchMode": "server.engine.base",
    "EmbeddedEngine": "server.engine.embedded",
    "Engine": "server.engine.base",
    "EngineChunk": "server.engine.base",
    "EngineError": "server.engine.errors",
    "EngineProtocolError": "server.engine.errors",
    "EngineRejected": "server.engine.errors",
    "EngineRequest": "server.engine.base",
    "EngineResult": "server.engine.base",
    "EngineServerError": "server.engine.errors",
    "EngineSimulator": "server.engine.simulator",
    "EngineTimeout": "server.engine.errors",
    "EngineUnavailable": "server.engine.errors",
    "Generation": "server.engine.generation",
    "LiveRequest": "server.engine.live",
    "LiveSimulator": "server.engine.live",
    "RadixCache": "server.engine.radix_cache",
    "RequestOutcome": "server.engine.simulator",
    "SGLangHTTPEngine": "server.engine.sglang_http",
    "SimRequest": "server.engine.simulator",
    "Step": "server.engine.simulator",
    "Usage": "server.engine.base",
    "create_sglang_app": "server.engine.sglang_app",
    "make_engine": "server.engine.factory",
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
    "Usage",
    "create_sglang_app",
    "make_engine",
]


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'server.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
