"""The server's log lines: plain text, or one JSON object a line (`serve --log-format json`).

A JSON line carries the time, level, logger and message, and for a line written while a
request is handled its `request_id` (the `x-request-id` its answer carries), `user` and
`batch` (`server.request_context`); an exception's traceback goes in `exc_info`. uvicorn's own
loggers (its access log included) are routed through the same handler, so that every line
the process writes has one format.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Literal

import orjson

from inference_auctions.server.request_context import RequestFields

__all__ = ["JsonFormatter", "LogFormat", "configure_logging", "uvicorn_log_config"]

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the request's fields (None outside a request)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "user": getattr(record, "user", None),
            "batch": getattr(record, "batch", None),
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(level: str, log_format: LogFormat) -> None:
    """The root logger's one handler, in `log_format`, with the request's fields on every
    record it writes."""
    handler = logging.StreamHandler()
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    # On the handler, not a logger: a filter on a logger misses what its children propagate.
    handler.addFilter(RequestFields())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def uvicorn_log_config(log_format: LogFormat) -> dict[str, Any] | None:
    """uvicorn's `log_config` for `json`: its loggers without handlers of their own, so that
    their lines reach the root's JSON handler; None for `text` (keep uvicorn's default)."""
    if log_format == "text":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {name: {"handlers": [], "propagate": True} for name in _UVICORN_LOGGERS},
    }
