"""Decode and validate request bodies: small ones at once, large ones in worker processes.

JSON decoding and validation are CPU-bound and hold the GIL: on the event loop (or in a thread)
a 10 MB body stalls every other request for as long as it takes. Bodies above
`INLINE_BODY_BYTES` are therefore decoded in a small pool of worker processes, at a lower CPU
priority, which send back only the validated model (or the reason it was refused): a
hostile body then costs its sender time, not the other users'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from inference_auctions.server.api.json_reader import BodyRefused, decode_json, json_depth
from inference_auctions.server.api.schemas import BodyLimits, RequestBody
from inference_auctions.server.api.validation_messages import describe_validation_error

__all__ = ["INLINE_BODY_BYTES", "BodyDecoder", "validate_body"]

Model = TypeVar("Model", bound=BaseModel)

# Up to this size a body is decoded on the event loop: a few milliseconds at most, about what
# a hand-off to another process costs.
INLINE_BODY_BYTES = 64 * 1024
_WORKERS = 2
_WORKER_NICENESS = 10


def validate_body(body: bytes, model: type[Model], limits: BodyLimits) -> Model:
    """The body as `model`, or `BodyRefused` saying what is wrong with it."""
    if len(body) > INLINE_BODY_BYTES:
        _refuse_early(body, model, limits)
    data = decode_json(body, limits.max_json_depth)
    if not isinstance(data, Mapping):
        raise BodyRefused("the body must be a JSON object")
    if issubclass(model, RequestBody):
        model.check_raw(data, limits)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise BodyRefused(*describe_validation_error(error.errors())) from None


def _refuse_early(body: bytes, model: type[BaseModel], limits: BodyLimits) -> None:
    """The size limits on a quick parse (floats in C, not exact decimals in Python): a large
    hostile body costs a tenth of the exact parse; one that passes gets the exact one."""
    if not issubclass(model, RequestBody) or json_depth(body) > limits.max_json_depth:
        return
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return  # the exact parse says what is wrong
    if isinstance(data, Mapping):
        model.check_raw(data, limits)


def _lower_priority() -> None:
    os.nice(_WORKER_NICENESS)


def _ready() -> None:
    """A first job for each worker, so that it has imported this module before real work."""


class BodyDecoder:
    """Owns the worker processes (started on the first large body) of one app."""

    def __init__(self, workers: int = _WORKERS) -> None:
        self._workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    def _start_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # forkserver: forking this process, which runs threads, would be unsafe.
        context = multiprocessing.get_context("forkserver")
        pool = concurrent.futures.ProcessPoolExecutor(
            self._workers, mp_context=context, initializer=_lower_priority
        )
        # Each submit to a pool without an idle worker starts one, in the submitting thread;
        # here, so that the event loop never waits for a process to start.
        for started in [pool.submit(_ready) for _ in range(self._workers)]:
            started.result()
        return pool

    async def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        async with self._starting:
            if self._pool is None:
                self._pool = await asyncio.to_thread(self._start_pool)
            return self._pool

    async def validate(self, body: bytes, model: type[Model], limits: BodyLimits) -> Model:
        """`validate_body`, off the event loop when the body is large."""
        if len(body) <= INLINE_BODY_BYTES:
            return validate_body(body, model, limits)
        pool = await self._executor()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.run_in_executor(pool, validate_body, body, model, limits)
        try:
            result: Model = await future
        except BrokenProcessPool:
            self._pool = None  # a worker died (killed for memory?): the next body gets new ones
            raise
        return result

    def close(self) -> None:
        """Stop the workers; bodies still being decoded are dropped."""
        if self._pool is not None:
            workers = list(self._pool._processes.values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            # A worker busy with a hostile body would hold up the process's exit until done.
            for worker in workers:
                worker.terminate()
            self._pool = None
