"""The SDK's logger: `INFERENCE_AUCTION_LOG=info` reports retries, `debug` every request."""

from __future__ import annotations

import logging
import os

from ._constants import LOG_ENV

__all__ = ["logger", "setup_logging"]

logger = logging.getLogger("inference_auctions")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def setup_logging() -> None:
    """Send the SDK's log records to stderr at the level `INFERENCE_AUCTION_LOG` names."""
    level = _LEVELS.get(os.environ.get(LOG_ENV, "").strip().lower())
    if level is None or logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("[%(asctime)s - %(name)s:%(lineno)d - %(levelname)s] %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(level)
