"""The embedded engine: the SGLang emulator in this process, used when no engine URL is given.

Requests go straight to a `LiveSimulator` (no HTTP), in dispatch order and all at once: the
simulator orders them by priority, then arrival, as SGLang's priority scheduling would. The
outputs are the same dicts the emulator's `/generate` returns. Prompts are tokenized with the
default tokenizer (`server.engine.builtin_tokenizer`), which the emulator's `/tokenize` uses too.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

import numpy as np

from inference_auctions.server.emulator.cost_model import CostModel
from inference_auctions.server.emulator.live import DEFAULT_MODEL_NAME, LiveRequest, LiveSimulator
from inference_auctions.server.emulator.sglang_request import (
    check_vocabulary,
    parse_sampling_params,
)
from inference_auctions.server.emulator.simulator import DEFAULT_CACHE_TOKENS, EngineSimulator
from inference_auctions.server.engine.builtin_tokenizer import VOCABULARY_SIZE, encode
from inference_auctions.server.engine.errors import (
    ChatRefused,
    EngineError,
    EngineRejected,
    EngineServerError,
    EngineUnavailable,
)
from inference_auctions.server.engine.protocol import (
    EngineBase,
    EngineChunk,
    EngineResult,
    Generation,
    TokenArray,
    TokenIds,
    check_context_length,
    render_chat,
)

__all__ = ["EmbeddedEngine"]


def _abort_error(reason: dict[str, object]) -> EngineError:
    message = str(reason.get("message") or "the request was aborted")
    status = reason.get("status_code")
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        return EngineUnavailable(message, engine_status=HTTPStatus.SERVICE_UNAVAILABLE)
    return EngineServerError(message, engine_status=status if isinstance(status, int) else None)


# Longer texts take milliseconds to tokenize: long enough to stall every other request.
_INLINE_TOKENIZE_CHARS = 20_000


class EmbeddedEngine(EngineBase):
    """The emulated SGLang server, in process (see the module docstring)."""

    name = "embedded"

    def __init__(
        self,
        live: LiveSimulator | None = None,
        *,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        cost_model: CostModel | None = None,
        time_scale: float = 1.0,
        model_name: str = DEFAULT_MODEL_NAME,
        max_running_requests: int | None = None,
    ) -> None:
        super().__init__()
        if live is None:
            simulator = EngineSimulator(
                cache_tokens=cache_tokens,
                cost_model=cost_model,
                max_running_requests=max_running_requests,
            )
            live = LiveSimulator(simulator, time_scale=time_scale, model_name=model_name)
        self.live = live
        self.model_name = live.model_name

    async def start(self) -> None:
        """Start the emulated engine's clock."""
        await self.live.start()

    async def close(self) -> None:
        """Cancel running generations and stop the emulated engine."""
        await self._cancel_all()
        await self.live.close()

    async def health(self) -> bool:
        """True while the emulated engine runs."""
        return self.live.running

    async def tokenize_array(self, text: str) -> TokenArray:
        """The token ids of `text` as a read-only int32 array."""
        array = np.asarray(await self.tokenize(text), dtype=np.int32)
        array.flags.writeable = False
        return array

    async def tokenize(self, text: str) -> list[int]:
        """Token ids from the default tokenizer (a long text off the event loop)."""
        if len(text) > _INLINE_TOKENIZE_CHARS:
            return await asyncio.to_thread(encode, text)
        return encode(text)

    async def tokenize_chat(self, messages: list[tuple[str, str]]) -> TokenArray:
        """The emulator's fixed chat template (`server.engine.protocol.render_chat`)."""
        return await self.tokenize_array(render_chat(messages))

    async def tokenize_tool_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TokenArray:
        """Refused: the emulator's fixed template has no tools, and it generates no text a
        call could be read from."""
        raise ChatRefused("the embedded emulator cannot render tools or tool calls")

    async def context_length(self) -> int:
        """The emulated model's context: its KV capacity, as the emulator's `/tokenize` says."""
        return self.live.simulator.cache.capacity

    async def vocab_size(self) -> int:
        """The builtin tokenizer's vocabulary, the emulated model's."""
        return VOCABULARY_SIZE

    async def server_info(self) -> dict[str, Any]:
        """The emulated `/server_info`: the simulator's limits, as SGLang states them."""
        return self.live.server_info()

    async def loads(self) -> dict[str, Any]:
        """The emulated `/v1/loads`: one rank."""
        return {"loads": [self.live.loads()]}

    async def flush_cache(self) -> bool:
        """Empty the emulated prefix cache, unless requests run or wait."""
        return self.live.flush_cache()

    def _send(self, generations: list[Generation]) -> None:
        capacity = self.live.simulator.cache.capacity
        # One arrival time for the whole batch: the engine then queues it as one and serves it
        # by priority, as a saturated SGLang server would.
        arrival = self.live.model_now() if self.live.running else None
        for generation in generations:
            request = generation.request
            try:
                options = parse_sampling_params(request.sampling_params)
                input_ids = _as_list(request.input_ids)
                check_vocabulary(input_ids, VOCABULARY_SIZE)
                check_context_length(
                    len(input_ids),
                    request.sampling_params.get("max_new_tokens"),
                    capacity,
                )
                submitted = self.live.submit(
                    input_ids,
                    max_new_tokens=capacity
                    if options.max_new_tokens is None
                    else options.max_new_tokens,
                    rid=request.rid,
                    priority=request.priority,
                    stream=request.stream,
                    sampling_seed=options.sampling_seed,
                    arrival=arrival,
                    stream_interval=options.stream_interval,
                )
            except ValueError as error:
                generation.fail(EngineRejected(str(error), engine_status=HTTPStatus.BAD_REQUEST))
                continue
            except RuntimeError as error:
                generation.fail(EngineUnavailable(str(error)))
                continue
            generation.admit()
            # A generation cancelled or failed early frees the engine's memory.
            generation.on_end(submitted.abort)
            generation.start(self._relay(generation, submitted))

    async def _relay(self, generation: Generation, submitted: LiveRequest) -> None:
        async for output in submitted.outputs():
            chunk = EngineChunk(
                generation.rid, output["text"], output["output_ids"], output["meta_info"]
            )
            reason = chunk.finish_reason
            if reason is not None and reason.get("type") == "abort":
                raise _abort_error(reason)
            generation.emit(chunk)
            if chunk.finished:
                generation.finish(EngineResult.from_chunk(chunk))


def _as_list(ids: TokenIds) -> list[int]:
    """Plain ints for the emulator, which keys its radix cache by tuples of them."""
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
