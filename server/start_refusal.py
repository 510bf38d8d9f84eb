"""A start refused on purpose says why in one line, without a traceback.

The lifespan raises `StartRefused` for a refusal whose message says everything, already
logged (another replica on the ledger clears under another pricing rule). Starlette would
hand uvicorn the traceback of whatever the lifespan raised, and uvicorn logs it under that
line: `one_line_refusals` sends uvicorn the refusal without it, and `QuietStartupFailure`
drops uvicorn's own "Application startup failed" after it. Any other error keeps its
traceback, since its message alone may not say where it came from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Message, Receive, Scope, Send

__all__ = ["QuietStartupFailure", "StartRefused", "one_line_refusals"]

Lifespan = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]


class StartRefused(Exception):
    """The server does not start, for the reason its message says (logged already)."""


def one_line_refusals(lifespan: Lifespan) -> Lifespan:
    """`lifespan` (a router's ASGI lifespan handler), which reports a `StartRefused` to the
    server without its traceback."""

    async def handled(scope: Scope, receive: Receive, send: Send) -> None:
        failed: list[Message] = []

        async def held(message: Message) -> None:
            # The failure is reported before the error is raised: held until it is known.
            if message["type"] == "lifespan.startup.failed":
                failed.append(message)
            else:
                await send(message)

        try:
            await lifespan(scope, receive, held)
        except StartRefused:
            for message in failed:
                await send({**message, "message": ""})
            raise
        except BaseException:
            for message in failed:
                await send(message)
            raise
        for message in failed:
            await send(message)

    return handled


class QuietStartupFailure(logging.Filter):
    """On uvicorn's logger: drops its "Application startup failed" once `refused()` says the
    refusal was logged in a line of its own."""

    def __init__(self, refused: Callable[[], bool]) -> None:
        super().__init__()
        self._refused = refused

    def filter(self, record: logging.LogRecord) -> bool:
        """False for uvicorn's line after a refusal; True for everything else."""
        return not (
            record.getMessage().startswith("Application startup failed") and self._refused()
        )
