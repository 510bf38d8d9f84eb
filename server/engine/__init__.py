"""Talking to an engine: the protocol the server programs against, and the SGLang client.

* The protocol: `Engine`, `EngineRequest`, `Generation`, `EngineChunk`, `EngineResult`, and
  the `EngineError` hierarchy (`server.engine.errors`).
* `SGLangHTTPEngine`: an unmodified SGLang server reached over HTTP (`priority` or `ordered`
  mode), with the tokenizers it may use in this process (`server.engine.local_tokenizer`).

The SGLang emulator is a room of its own (`server.emulator`) that implements this protocol;
nothing here imports it. `server.engine_choice.make_engine` picks one or the other.

Names are imported on first use, so that importing one of them loads only its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_auctions.server.engine.errors import (
        EngineError,
        EngineProtocolError,
        EngineRejected,
        EngineServerError,
        EngineTimeout,
        EngineUnavailable,
        TokenizerMismatch,
    )
    from inference_auctions.server.engine.protocol import (
        DispatchMode,
        Engine,
        EngineChunk,
        EngineRequest,
        EngineResult,
        Generation,
        Usage,
    )
    from inference_auctions.server.engine.sglang_http import SGLangHTTPEngine

_MODULES = {
    "DispatchMode": "inference_auctions.server.engine.protocol",
    "Engine": "inference_auctions.server.engine.protocol",
    "EngineChunk": "inference_auctions.server.engine.protocol",
    "EngineError": "inference_auctions.server.engine.errors",
    "EngineProtocolError": "inference_auctions.server.engine.errors",
    "EngineRejected": "inference_auctions.server.engine.errors",
    "EngineRequest": "inference_auctions.server.engine.protocol",
    "EngineResult": "inference_auctions.server.engine.protocol",
    "EngineServerError": "inference_auctions.server.engine.errors",
    "EngineTimeout": "inference_auctions.server.engine.errors",
    "EngineUnavailable": "inference_auctions.server.engine.errors",
    "Generation": "inference_auctions.server.engine.protocol",
    "SGLangHTTPEngine": "inference_auctions.server.engine.sglang_http",
    "TokenizerMismatch": "inference_auctions.server.engine.errors",
    "Usage": "inference_auctions.server.engine.protocol",
}

__all__ = [
    "DispatchMode",
    "Engine",
    "EngineChunk",
    "EngineError",
    "EngineProtocolError",
    "EngineRejected",
    "EngineRequest",
    "EngineResult",
    "EngineServerError",
    "EngineTimeout",
    "EngineUnavailable",
    "Generation",
    "SGLangHTTPEngine",
    "TokenizerMismatch",
    "Usage",
]


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
