"""The small protocol the server programs against to reach an engine.

A batch's requests, in auction order, go to `Engine.dispatch`, which returns one `Generation`
per request at once and sends them in the background in that order (how depends on the
engine and its mode: an SGLang `priority` field, or one request at a time). The server then
awaits each generation's `result()` or iterates its `chunks()`; failures surface there as
`server.engine.errors.EngineError` subclasses, which carry the HTTP status to answer with.

Outputs keep SGLang's shape: `text` and `output_ids` are cumulative, and `meta_info` is the dict
SGLang returned, untouched; the properties below read the fields the server needs from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from inference_auctions.server.engine.generation import Generation

__all__ = [
    "DispatchMode",
    "Engine",
    "EngineChunk",
    "EngineRequest",
    "EngineResult",
    "TokenArray",
    "TokenIds",
    "Usage",
]

# A prompt's token ids as the request path carries them: a read-only integer array from the
# tokenizer (int32 while the ids fit), handed to the auction core and serialized to the engine
# without a Python list in between. Tests and simple callers may pass a list.
TokenArray: TypeAlias = npt.NDArray[np.int32] | npt.NDArray[np.int64]
TokenIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]

# `priority`: send a batch at once, each request with its schedule sequence number as SGLang's
# priority. `ordered`: send request k+1 only once request k has produced its first token.
DispatchMode = Literal["priority", "ordered"]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation to run: its global schedule sequence number is its `priority`."""

    rid: str
    input_ids: TokenIds
    sampling_params: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    stream: bool = False

    def __post_init__(self) -> None:
        if not self.rid:
            raise ValueError("rid must be a non-empty string")
        if len(self.input_ids) == 0:
            raise ValueError("input_ids must not be empty")


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request, as SGLang reports them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def _int_field(meta_info: dict[str, Any], key: str) -> int:
    value = meta_info.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float_field(meta_info: dict[str, Any], key: str) -> float | None:
    value = meta_info.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


@dataclass(frozen=True, slots=True)
class EngineChunk:
    """One streamed output: cumulative text and ids so far, and SGLang's `meta_info`."""

    rid: str
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]

    @property
    def finish_reason(self) -> dict[str, Any] | None:
        """SGLang's finish reason; None while the request is still running."""
        reason = self.meta_info.get("finish_reason")
        return reason if isinstance(reason, dict) else None

    @property
    def finished(self) -> bool:
        """True for the last chunk of a request."""
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class EngineResult:
    """A finished generation: its text, ids, SGLang's `meta_info`, and a client-side TTFT."""

    rid: str
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]
    # Seconds from sending the request to its first streamed chunk, measured by this process;
    # None when the request was not streamed.
    client_ttft: float | None = None

    @property
    def finish_reason(self) -> dict[str, Any] | None:
        """SGLang's finish reason, e.g. `{"type": "length", "length": 128}`."""
        reason = self.meta_info.get("finish_reason")
        return reason if isinstance(reason, dict) else None

    @property
    def usage(self) -> Usage:
        """Prompt, completion and cached token counts from `meta_info`."""
        meta = self.meta_info
        return Usage(
            _int_field(meta, "prompt_tokens"),
            _int_field(meta, "completion_tokens"),
            _int_field(meta, "cached_tokens"),
        )

    @property
    def ttft(self) -> float | None:
        """Time to first token: the engine's `first_token_latency`, else `client_ttft`."""
        reported = _float_field(self.meta_info, "first_token_latency")
        return reported if reported is not None else self.client_ttft

    @property
    def e2e_latency(self) -> float | None:
        """The engine's end-to-end latency in seconds, when reported."""
        return _float_field(self.meta_info, "e2e_latency")

    @classmethod
    def from_chunk(cls, chunk: EngineChunk, client_ttft: float | None = None) -> EngineResult:
        """The result whose last chunk is `chunk`."""
        return cls(chunk.rid, chunk.text, chunk.output_ids, chunk.meta_info, client_ttft)


class Engine(Protocol):
    """What the server needs from an engine (see the module docstring)."""

    name: str

    async def start(self) -> None:
        """Open connections or start the embedded engine."""

    async def close(self) -> None:
        """Stop: generations still running fail with `EngineUnavailable`."""

    async def health(self) -> bool:
        """True if the engine answers its health check."""

    async def tokenize_array(self, text: str) -> TokenArray:
        """The token ids of `text` as a read-only array (what the request path carries)."""

    async def tokenize(self, text: str) -> list[int]:
        """The engine's token ids for `text` (cached by prompt where that costs I/O)."""

    async def tokenize_chat(self, messages: list[tuple[str, str]]) -> TokenArray:
        """The prompt ids of (role, content) messages in the engine's chat template, ending
        with the opening of the assistant's turn, as its own chat route renders them."""

    async def context_length(self) -> int | None:
        """The model's context length in tokens (None when the engine does not say)."""

    async def vocab_size(self) -> int | None:
        """How many token ids the model has (a prompt's ids must be below it); None when
        nothing tells."""

    async def flush_cache(self) -> bool:
        """Empty the engine's prefix cache; False while requests run or wait (SGLang's rule)."""

    async def server_info(self) -> dict[str, Any] | None:
        """SGLang's `/server_info` (limits in `internal_states`); None when not stated."""

    async def loads(self) -> dict[str, Any] | None:
        """SGLang's `/v1/loads` (`num_waiting_reqs` per rank); None when not stated."""

    def forget_prompt(self, tokens: TokenIds) -> None:
        """Drop a refused request's prompt (these ids) from what the engine client caches."""

    def dispatch(self, requests: Sequence[EngineRequest]) -> list[Generation]:
        """Send `requests` in this order, in the background; one `Generation` each."""

    async def generate(self, request: EngineRequest) -> EngineResult:
        """Run one request to its end (raises `EngineError`)."""

    def stream(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Run one request, yielding its chunks; the last has a finish reason."""
