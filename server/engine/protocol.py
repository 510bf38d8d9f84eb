"""The engine protocol: what the server programs against, SGLang's contract, a request in flight.

A batch's requests, in auction order, go to `Engine.dispatch`, which returns one `Generation`
per request at once and sends them in the background in that order (how depends on the
engine and its mode: an SGLang `priority` field, or one request at a time). The server then
awaits each generation's `result()` or iterates its `chunks()`; failures surface there as
`server.engine.errors.EngineError` subclasses, which carry the HTTP status to answer with.

Outputs keep SGLang's shape: `text` and `output_ids` are cumulative, and `meta_info` is the dict
SGLang returned, untouched; the properties below read the fields the server needs from it.

A request in flight at an engine, the bookkeeping every engine shares, and waiting on it.

A `Generation` is produced by an engine's task and consumed by the server: the producer
reports admission, chunks, and the end (a result or an `EngineError`); the consumer awaits
`admitted()`, iterates `chunks()` or awaits `result()`. Chunks are buffered, so a consumer that
only wants the result can ignore them.

A consumer may instead drive the generation (`Driver`, given to `Engine.dispatch`): the
engine's producer then runs on a task of the driver's making (`Driver.drive`), which hands
each chunk to `Driver.chunk` as it is read and, once the producer ended, goes on with what
the driver does next. The server follows each request this way, on one task per request,
where a producer task and a consumer task would hand every chunk from one to the other. A
driven generation that ends without ever starting (refused, cancelled in the engine's queue)
still gets its driver's task, with nothing to produce.

`EngineBase` gives every engine the same `generate`, `stream` and `close` on top of its own
`dispatch`, and cancels what is still running when the engine closes.

Every request in flight has one, so its signals are plain futures made on demand rather than
an `asyncio.Queue` and two `asyncio.Event`s per request: a chunk wakes the one consumer
waiting for it, and nothing is allocated for a signal nobody awaits.

`Waiters`: readers waiting for one kind of change of an object, each on a future of its own.

Every request creates objects that others wait on (its ticket, its engine generation), so
their signals must be cheap: no lock as in an `asyncio.Condition`, and nothing allocated until
somebody actually waits. A change resolves every future waiting at that moment, once; a
reader that is cancelled cancels only its own future.

What SGLang 0.5.23's `/generate` contract says that both sides of it need to know.

The auction server refuses at admission what SGLang would refuse for a request's length, and
the SGLang emulator (`server.emulator`) refuses the same with the same words; both read the
facts here.
"""

from __future__ import annotations

import asyncio
import contextvars
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from inference_auctions.server.engine.errors import EngineError, EngineUnavailable

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "REQUEST_LEVEL_KEYS",
    "ContextTooLong",
    "DispatchMode",
    "Driver",
    "Engine",
    "EngineBase",
    "EngineChunk",
    "EngineRequest",
    "EngineResult",
    "Generation",
    "TokenArray",
    "TokenIds",
    "Usage",
    "Waiters",
    "check_context_length",
    "render_chat",
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
    # Header lines (`name: value\r\n`) sent with it to an engine over HTTP: the W3C trace
    # headers its client sent, so that a trace goes on through the engine.
    headers: bytes = b""

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


class Driver(Protocol):
    """What follows one generation on its own task (see the module docstring)."""

    # The context its task runs in (None: the current one where it is started).
    context: contextvars.Context | None

    def chunk(self, chunk: EngineChunk) -> None:
        """A chunk, as the engine read it (on the driving task)."""

    async def drive(self, generation: Generation, produce: Awaitable[None]) -> None:
        """Await `produce` (the engine's side, to the generation's end; it never raises but
        a cancellation from outside), then do what follows."""


class Engine(Protocol):
    """What the server needs from an engine (see the module docstring)."""

    name: str
    model_name: str | None  # the served model's name, once the engine has stated it

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

    async def tokenize_tool_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TokenArray:
        """The prompt ids of OpenAI-shaped messages (tool calls and results among them) with
        `tools` offered, in the engine's chat template; `ChatRefused` where it cannot."""

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

    def dispatch(
        self, requests: Sequence[EngineRequest], drivers: Sequence[Driver] | None = None
    ) -> list[Generation]:
        """Send `requests` in this order, in the background; one `Generation` each, driven by
        its driver when `drivers` (one per request) are given."""

    async def generate(self, request: EngineRequest) -> EngineResult:
        """Run one request to its end (raises `EngineError`)."""

    def stream(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Run one request, yielding its chunks; the last has a finish reason."""


_UNREAD_CHUNKS = 16  # unread chunks kept apart; more are merged into the latest


class Generation:
    """One request handed to an engine (see the module docstring)."""

    def __init__(self, request: EngineRequest, driver: Driver | None = None) -> None:
        self.request = request
        self._driver = driver
        # While its driven producer runs: `cancel` then stops the producer, not the driver.
        self._producing = False
        self._cancelled_here = False
        self._chunks: deque[EngineChunk | EngineError] = deque()
        self._chunk_waiter: asyncio.Future[None] | None = None  # the consumer, if it waits
        self._admitted = False
        self._admitted_waiters = Waiters()
        self._done = False
        self._done_waiters = Waiters()
        self._result: EngineResult | None = None
        self._error: EngineError | None = None
        self._task: asyncio.Task[None] | None = None
        self._finished_chunk = False
        self._cleanups: list[Callable[[], object]] = []

    @property
    def rid(self) -> str:
        """The request id."""
        return self.request.rid

    def done(self) -> bool:
        """True once it has a result or an error."""
        return self._done

    @property
    def error(self) -> EngineError | None:
        """The error that ended it, if it failed."""
        return self._error

    @property
    def is_admitted(self) -> bool:
        """Whether the engine has taken the request (or it already ended), without waiting."""
        return self._admitted

    async def admitted(self) -> None:
        """Wait until the engine has taken the request (or it already ended); never raises."""
        if not self._admitted:
            await self._admitted_waiters.wait()

    async def result(self) -> EngineResult:
        """The final result; raises the `EngineError` that ended it."""
        if not self._done:
            await self._done_waiters.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    async def chunks(self) -> AsyncIterator[EngineChunk]:
        """Its chunks as they come, the last finished; raises the `EngineError` that ended it.

        A request that was not streamed yields one chunk: its result. Iterate it once.
        """
        while True:
            while not self._chunks:
                waiter = self._chunk_waiter = asyncio.get_running_loop().create_future()
                await waiter
            item = self._chunks.popleft()
            if isinstance(item, EngineError):
                raise item
            yield item
            if item.finished:
                return

    def cancel(self, reason: str = "the generation was cancelled") -> None:
        """Stop the request (the engine aborts it); waiters get `EngineUnavailable`."""
        task = self._task
        if task is not None and not task.done():
            if self._driver is None:
                task.cancel()
            elif self._producing and not self._cancelled_here:
                # The driver's task runs the producer: cancel that, and let the driver go on.
                self._cancelled_here = True
                task.cancel()
        self.fail(EngineUnavailable(reason))

    # The producer's side, called by engines.

    def start(self, producer: Coroutine[Any, Any, None]) -> None:
        """Run `producer` as this generation's task (its driver's, when it has one); an
        exception it raises ends it."""
        driver = self._driver
        if driver is None:
            self._task = asyncio.create_task(producer, name=f"generation-{self.rid}")
            self._task.add_done_callback(self._producer_done)
            return
        self._task = asyncio.create_task(
            driver.drive(self, self._produce(producer)),
            name=f"generation-{self.rid}",
            context=driver.context,
        )

    async def _produce(self, producer: Coroutine[Any, Any, None]) -> None:
        """Run a driven generation's producer on the driver's task; what it raises ends the
        generation, as `_producer_done` does for a task of its own. Only a cancellation from
        outside (not `cancel`'s) goes on to the driver."""
        if self._done:  # ended (cancelled) before its task first ran
            producer.close()
            return
        self._producing = True
        task = asyncio.current_task()
        try:
            await producer
        except asyncio.CancelledError:
            self.fail(EngineUnavailable("the generation was cancelled"))
            if not self._cancelled_here or task is None or task.uncancel() > 0:
                raise  # a cancellation from outside (a deadline's scope, a shutdown)
            self._cancelled_here = False
        except EngineError as error:
            self.fail(error)
        except Exception as error:  # a bug in a producer must still end the request
            self.fail(EngineError(f"unexpected engine failure: {error!r}"))
        finally:
            self._producing = False
        if self._cancelled_here and task is not None:
            task.uncancel()  # the producer swallowed the cancellation `cancel` asked for
        self._cancelled_here = False
        if not self._done:
            self.fail(EngineError("the engine ended the request without a result"))

    def on_end(self, cleanup: Callable[[], object]) -> None:
        """Call `cleanup` when the generation ends, however it ends (even if never started)."""
        if self.done():
            cleanup()
        else:
            self._cleanups.append(cleanup)

    def admit(self) -> None:
        """Report that the engine has taken the request."""
        if not self._admitted:
            self._admitted = True
            self._admitted_waiters.wake()

    def emit(self, chunk: EngineChunk) -> None:
        """Report a chunk; a finished one is not the end until `finish` is called."""
        if self.done():
            return  # cancelled meanwhile: its consumer has had its error
        self.admit()
        self._finished_chunk = chunk.finished
        if self._driver is not None:
            self._driver.chunk(chunk)
            return
        chunks = self._chunks
        if len(chunks) >= _UNREAD_CHUNKS and isinstance(chunks[-1], EngineChunk):
            # Chunks are cumulative: past a few unread ones, this one replaces the one before,
            # so a slow consumer costs memory linear in the answer, not a pile of copies.
            chunks[-1] = chunk
            return
        self._push(chunk)

    def finish(self, result: EngineResult) -> None:
        """Report the result; it is also the last chunk unless a finished one was emitted."""
        if self.done():
            return
        if not self._finished_chunk:
            self.emit(EngineChunk(result.rid, result.text, result.output_ids, result.meta_info))
        self._result = result
        self._end()

    def fail(self, error: EngineError) -> None:
        """Report the failure that ended the request."""
        if self.done():
            return
        self._error = error
        if self._driver is None:
            self._push(error)
        self._end()

    async def wait_task(self) -> None:
        """Wait for the producer task to end (used when an engine closes)."""
        if self._task is not None:
            await asyncio.wait([self._task])

    def _push(self, item: EngineChunk | EngineError) -> None:
        self._chunks.append(item)
        waiter, self._chunk_waiter = self._chunk_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self.admit()
        self._done = True
        self._done_waiters.wake()
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in cleanups:
            cleanup()
        driver = self._driver
        if driver is not None and self._task is None:
            # Ended without ever starting: its driver still follows it to its end.
            self._task = asyncio.create_task(
                driver.drive(self, _nothing()),
                name=f"generation-{self.rid}",
                context=driver.context,
            )

    def _producer_done(self, task: asyncio.Task[None]) -> None:
        # A callback rather than a wrapper coroutine: a task cancelled before it ever ran
        # still ends its generation.
        if task.cancelled():
            self.fail(EngineUnavailable("the generation was cancelled"))
            return
        error = task.exception()
        if isinstance(error, EngineError):
            self.fail(error)
        elif error is not None:  # a bug in a producer must still end the request
            self.fail(EngineError(f"unexpected engine failure: {error!r}"))
        elif not self.done():
            self.fail(EngineError("the engine ended the request without a result"))


async def _nothing() -> None:
    """The producer of a generation that ended before it started."""


class EngineBase(ABC):
    """`generate`, `stream` and cancellation on close, shared by every engine.

    A subclass implements `_send(generations)`, which starts each generation in order.
    """

    name = "engine"

    def __init__(self) -> None:
        # The served model's name, as the engine states it (None until it has).
        self.model_name: str | None = None
        self._generations: set[Generation] = set()
        self._closed = False

    def dispatch(
        self, requests: Sequence[EngineRequest], drivers: Sequence[Driver] | None = None
    ) -> list[Generation]:
        """Send `requests` in this order, in the background; one `Generation` each, driven by
        its driver when `drivers` (one per request) are given."""
        if drivers is None:
            generations = [Generation(request) for request in requests]
        else:
            generations = [
                Generation(request, driver)
                for request, driver in zip(requests, drivers, strict=True)
            ]
        if self._closed:
            for generation in generations:
                generation.fail(EngineUnavailable(f"the {self.name} engine is closed"))
            return generations
        # The running ones, each leaving the set as it ends: no sweep of the set per dispatch.
        running = self._generations
        for generation in generations:
            running.add(generation)
            generation.on_end(partial(running.discard, generation))
        self._send(generations)
        return generations

    async def generate(self, request: EngineRequest) -> EngineResult:
        """Run one request to its end (raises `EngineError`)."""
        generation = self.dispatch([request])[0]
        try:
            return await generation.result()
        finally:
            if not generation.done():
                generation.cancel()

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Run one request, yielding its chunks; the last has a finish reason."""
        generation = self.dispatch([request])[0]
        try:
            async for chunk in generation.chunks():
                yield chunk
        finally:
            if not generation.done():
                generation.cancel()

    async def server_info(self) -> dict[str, Any] | None:
        """The engine's `/server_info` (its limits); None for an engine that states none."""
        return None

    async def loads(self) -> dict[str, Any] | None:
        """The engine's `/v1/loads` (its waiting queue); None for an engine that has none."""
        return None

    def forget_prompt(self, tokens: Any) -> None:
        """Drop a refused request's prompt from the caches (an engine without one: nothing)."""
        del tokens

    @abstractmethod
    def _send(self, generations: list[Generation]) -> None:
        """Start `generations` in this order (each ends by `finish` or `fail`)."""

    async def _cancel_all(self) -> None:
        """Mark the engine closed and cancel every generation still running."""
        self._closed = True
        running = [g for g in self._generations if not g.done()]
        for generation in running:
            generation.cancel(f"the {self.name} engine was closed")
        for generation in running:
            await generation.wait_task()
        self._generations.clear()


class Waiters:
    """The futures of the readers waiting for the next change (see the module docstring)."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    def wait(self) -> asyncio.Future[None]:
        """A new future, resolved at the next `wake`."""
        future = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        return future

    def wake(self) -> None:
        """Resolve every future waiting now (a cancelled one is skipped)."""
        futures, self._futures = self._futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)


DEFAULT_MAX_NEW_TOKENS = 128
# Request options of SGLang's `/generate` body that the auction server carries with a
# request's sampling parameters; its SGLang backend sends them at the top level.
REQUEST_LEVEL_KEYS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
)


class ContextTooLong(ValueError):
    """The request does not fit the model's context; `field` is the part to shorten."""

    def __init__(self, message: str, field: Literal["prompt", "max_new_tokens"]) -> None:
        super().__init__(message)
        self.field = field


def check_context_length(prompt_tokens: int, max_new_tokens: object, context_length: int) -> None:
    """Refuse what SGLang 0.5.23's tokenizer manager refuses for the request's length.

    The prompt must be shorter than the context, and the prompt plus an explicit
    `max_new_tokens` too; the messages are SGLang's (a ValueError, which it answers with 400).
    Raises `ContextTooLong`, naming the part of the request to shorten.
    """
    if prompt_tokens >= context_length:
        raise ContextTooLong(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens).",
            "prompt",
        )
    if isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool):
        total = max_new_tokens + prompt_tokens
        if total >= context_length:
            raise ContextTooLong(
                "Requested token count exceeds the model's maximum context length of "
                f"{context_length} tokens. You requested a total of {total} tokens: "
                f"{prompt_tokens} tokens from the input messages and {max_new_tokens} tokens "
                "for the completion. Please reduce the number of tokens in the input messages "
                "or the completion to fit within the limit.",
                "max_new_tokens",
            )


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The plain chat template: the emulator's own, and the transcript sent to an SGLang whose
    `/tokenize` cannot render a conversation itself (`<|role|>` lines, then the assistant's)."""
    blocks = [f"<|{role}|>\n{content}\n" for role, content in messages]
    return "".join(blocks) + "<|assistant|>\n"
