"""Why a generation could not be served by the engine.

```
EngineError                  any failure to get a generation from the engine   -> HTTP 502
├── EngineUnavailable        no answer: connection refused or reset, DNS, engine closed,
│                            or the engine said 503 (starting, queue full)     -> HTTP 502
├── EngineTimeout            the connect timeout or the request deadline passed -> HTTP 504
├── EngineRejected           the engine answered 4xx: bad input, duplicate rid  -> HTTP 502
├── EngineServerError        the engine answered 5xx or aborted the request     -> HTTP 502
├── EngineProtocolError      the answer is unreadable: bad JSON, a stream cut
│                            before its last chunk                             -> HTTP 502
├── TokenizerMismatch        the local tokenizer (`tokenizer` setting) gives other
│                            ids than the engine's `/tokenize`: a misconfigured
│                            server, refused for every prompt it would tokenize -> HTTP 502
└── ChatRefused              a chat with tools or tool calls that the chat template
                             or the engine's `/tokenize` refused to render: the
                             client's conversation, so the route answers        -> HTTP 400
```

`http_status` is what the auction server should answer its own client; `engine_status` is the
status the engine itself returned, when there was one. An engine 4xx is still a 502 for the
auction server: its own input checks passed, so the fault is between it and the engine.
"""

from __future__ import annotations

from http import HTTPStatus

__all__ = [
    "ChatRefused",
    "EngineError",
    "EngineProtocolError",
    "EngineRejected",
    "EngineServerError",
    "EngineTimeout",
    "EngineUnavailable",
    "TokenizerMismatch",
]


class EngineError(Exception):
    """A generation failed at or on the way to the engine."""

    http_status: int = HTTPStatus.BAD_GATEWAY

    def __init__(self, message: str, *, engine_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.engine_status = engine_status


class EngineUnavailable(EngineError):
    """The engine could not be reached, or said it cannot take requests now."""


class EngineTimeout(EngineError):
    """The engine did not answer in time."""

    http_status = HTTPStatus.GATEWAY_TIMEOUT


class EngineRejected(EngineError):
    """The engine refused the request as invalid (a 4xx)."""


class EngineServerError(EngineError):
    """The engine failed while serving the request (a 5xx or an abort)."""


class EngineProtocolError(EngineError):
    """The engine's answer could not be read."""


class TokenizerMismatch(EngineError):
    """The local tokenizer gives other token ids than the engine's `/tokenize`."""


class ChatRefused(EngineError):
    """A chat with tools that the template or the engine would not render; its message says
    why, in the engine's or the template's words."""

    http_status = HTTPStatus.BAD_REQUEST
